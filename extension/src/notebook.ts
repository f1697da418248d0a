import { Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';

import { START_CELL_SOURCE } from './constants';

/**
 * Put the `%load_ext dtwork` / `%dtrain start` cell into the active notebook: into the
 * active cell when it is an empty code cell, else as a new cell below it.
 * Returns false (and says why) when no notebook is open.
 */
export function insertStartCell(tracker: INotebookTracker): boolean {
  const panel = tracker.currentWidget;
  if (!panel) {
    Notification.warning('Open a notebook first: the start cell goes into the active notebook.', {
      autoClose: 5000
    });
    return false;
  }
  const notebook = panel.content;
  const active = notebook.activeCell;
  const reuse =
    active !== null && active.model.type === 'code' && active.model.sharedModel.getSource().trim() === '';
  if (!reuse) {
    NotebookActions.insertBelow(notebook);
  }
  notebook.activeCell?.model.sharedModel.setSource(START_CELL_SOURCE);
  panel.activate();
  return true;
}
