import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';

import { registerCellView } from './cellview';
import { CommandIds, PALETTE_CATEGORY, PANEL_ID, PANEL_TITLE, PLUGIN_ID } from './constants';
import { dtworkIcon } from './icon';
import { insertStartCell } from './notebook';
import { DtworkPanel } from './panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'A sidebar for dtwork: clusters, runs and GPUs of data-parallel training.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ): void => {
    app.commands.addCommand(CommandIds.insertStartCell, {
      label: 'Insert dtwork start cell (%load_ext dtwork, %dtrain start)',
      caption: 'Insert a cell that starts a dtwork training cluster into the active notebook',
      execute: () => insertStartCell(tracker)
    });
    const panel = new DtworkPanel({
      icon: dtworkIcon,
      insertStartCell: () => void app.commands.execute(CommandIds.insertStartCell),
      // The default kernel spares a "Select Kernel" dialog when the report names none.
      openNotebook: path =>
        app.commands.execute('docmanager:open', {
          path,
          factory: 'Notebook',
          kernel: { name: app.serviceManager.kernelspecs.specs?.default ?? 'python3' }
        })
    });
    app.commands.addCommand(CommandIds.openPanel, {
      label: `Show the ${PANEL_TITLE} panel`,
      execute: () => app.shell.activateById(PANEL_ID)
    });
    palette?.addItem({ command: CommandIds.insertStartCell, category: PALETTE_CATEGORY });
    palette?.addItem({ command: CommandIds.openPanel, category: PALETTE_CATEGORY });
    app.shell.add(panel, 'left', { rank: 950 });
    // a training cell's output: its live widget, or its figure from the run store (cellview.ts)
    tracker.forEach(registerCellView);
    tracker.widgetAdded.connect((_, notebook) => registerCellView(notebook));
    restorer?.add(panel, PANEL_ID);
  }
};

export default plugin;
