/**
 * Cells whose code reaches the notebook through its model, not typed key by key: the editor re-indents
 * typed nested blocks at a pace set by the machine's load, so typed loops can come out mis-indented.
 */
import type { IJupyterLabPageFixture } from '@jupyterlab/galata';

/** The shape of the in-page objects this module touches (galata exposes the app on window.galata). */
interface ISourcePage {
  galata: {
    app: {
      shell: {
        currentWidget: {
          content: {
            model: {
              cells: { length: number; get(i: number): { sharedModel: { setSource(s: string): void } } };
            };
          };
        };
      };
    };
  };
}

/** Add a code cell at the end of the active notebook holding exactly `source`. */
export async function addCode(page: IJupyterLabPageFixture, source: string): Promise<void> {
  await page.notebook.addCell('code', '');
  await page.evaluate(text => {
    const cells = (window as unknown as ISourcePage).galata.app.shell.currentWidget.content.model.cells;
    cells.get(cells.length - 1).sharedModel.setSource(text);
  }, source);
}
