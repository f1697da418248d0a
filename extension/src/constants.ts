/** Every name and number the extension shares, in one place. */

export const PLUGIN_ID = 'dtwork:plugin';
export const PANEL_ID = 'dtwork-panel';
export const PANEL_TITLE = 'Distributed training';

/** REST routes live under <base_url>/dtwork/ (dtwork/server/routes.py). */
export const API_NAMESPACE = 'dtwork';

export const CommandIds = {
  insertStartCell: 'dtwork:insert-start-cell',
  openPanel: 'dtwork:open-panel'
} as const;

export const PALETTE_CATEGORY = 'dtwork';

/** The cell the "Insert start cell" button and palette entry put into the notebook. */
export const START_CELL_SOURCE = '%load_ext dtwork\n%dtrain start';

/** Poll periods (ms): GPUs every second, clusters and runs a little slower. */
export const GPU_POLL_MS = 1000;
export const DATA_POLL_MS = 2000;

/** Runs shown in the panel (newest first); the rest are counted. */
export const MAX_RUNS_SHOWN = 10;

/** Global batches an adaptive run's card names in its trajectory: the first, then the latest. */
export const MAX_BATCHES_SHOWN = 5;

/** Sparkline size in CSS pixels. */
export const SPARKLINE_WIDTH = 120;
export const SPARKLINE_HEIGHT = 28;

export const SERVER_MISSING_MESSAGE =
  'The dtwork server extension is not running in this Jupyter server, so the panel has ' +
  'nothing to read. Install dtwork in the Python environment that runs Jupyter ' +
  '(pip install dtwork), check that `jupyter server extension list` shows dtwork enabled, ' +
  'then restart JupyterLab.';
