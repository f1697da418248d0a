/**
 * The output of a training cell, in a notebook that may have lost its live widgets.
 *
 * The dashboard of a `%%dtrain` cell is ipywidgets, whose state a page loads from the kernel over
 * the shell channel: a page opened (or reloaded) while the cell trains gets no answer until the
 * cell ends, and then finds the widgets closed ("Loading widget..." for ever). So the dashboard's
 * output also carries CELL_MIME, naming the run and the cell (dtwork/plots/cell_view.py). This renderer
 * takes that output: the live widget when this page holds its model (the page that ran the cell),
 * else the same figure read from the run store through the server, redrawn while the cell trains
 * and left as the finished figure once it ends.
 */
import { PathExt } from '@jupyterlab/coreutils';
import type { NotebookPanel } from '@jupyterlab/notebook';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { PanelLayout, Widget } from '@lumino/widgets';

import { DATA_POLL_MS } from './constants';
import { runRoute } from './model';
import { Poller } from './poller';
import { requestAPI } from './request';

export const CELL_MIME = 'application/vnd.dtwork.cell+json';
const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';
const PLOTLY_MIME = 'application/vnd.plotly.v1+json';
/** Ahead of the widget view (ipywidgets takes -10): the bundle holds both. */
const CELL_RANK = -20;

/** How a cell ended (the store's cell status) in the header's words. */
const ENDED: Record<string, string> = { ok: 'finished', error: 'failed', interrupted: 'interrupted' };

type Registry = NotebookPanel['content']['rendermime'];

/** GET /dtwork/runs/<id>/cells/<seq> (dtwork/server/queries.py: cell_live). */
export interface ICellLive {
  run_id: number;
  seq: number;
  status: string;
  running: boolean;
  step: number | null;
  figure: { data: unknown[]; layout: Record<string, unknown> };
}

interface ICellRef {
  run_id: number;
  seq: number;
}

function mimeModel(data: Record<string, unknown>): IRenderMime.IMimeModel {
  return {
    trusted: true,
    data: data as IRenderMime.IMimeModel['data'],
    metadata: {},
    setData: () => undefined
  };
}

/** One cell's output: the live widget, or the figure from the run store. */
export class CellView extends Widget implements IRenderMime.IRenderer {
  private readonly _poller: Poller;
  private readonly _header: Widget;
  private _cell: ICellRef | null = null;
  private _plot: IRenderMime.IRenderer | null = null;
  private _drawn = ''; // the step and status of the figure on screen

  constructor(private readonly _panel: NotebookPanel | null) {
    super();
    this.addClass('dtwork-CellView');
    this.layout = new PanelLayout();
    this._header = new Widget();
    this._header.addClass('dtwork-CellView-header');
    this._poller = new Poller(() => this._refresh(), DATA_POLL_MS);
  }

  /** The notebook's folder: its kernel records in the store there (the server falls back to its
   * default store when that folder has none). */
  private _store(): string {
    return PathExt.dirname(this._panel?.context.path ?? '');
  }

  /** A renderer of the notebook's for `mime`, or null when no extension renders it. */
  private _renderer(mime: string): IRenderMime.IRenderer | null {
    const rendermime: Registry | undefined = this._panel?.content.rendermime;
    return rendermime?.getFactory(mime) ? rendermime.createRenderer(mime) : null;
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this._cell = model.data[CELL_MIME] as unknown as ICellRef;
    const widget = model.data[WIDGET_MIME] as { model_id?: string } | undefined;
    const kernel = this._panel?.sessionContext.session?.kernel;
    // The page that ran the cell holds a comm for each widget; a reopened page has none until the
    // kernel answers, which it does only after the cell (whose widgets are then closed).
    const renderer = this._renderer(WIDGET_MIME);
    if (model.trusted && widget?.model_id && renderer && kernel?.hasComm(widget.model_id)) {
      (this.layout as PanelLayout).addWidget(renderer);
      return renderer.renderModel(model);
    }
    renderer?.dispose();
    this.addClass('dtwork-mod-fromStore');
    (this.layout as PanelLayout).addWidget(this._header);
    this._header.node.textContent = `run ${this._cell.run_id}, cell ${this._cell.seq}: reading the run store…`;
    this._poller.start();
  }

  override dispose(): void {
    this._poller.stop();
    super.dispose();
  }

  private async _refresh(): Promise<void> {
    const cell = this._cell;
    if (cell === null || this.isDisposed) {
      return;
    }
    let live: ICellLive;
    try {
      live = await requestAPI<ICellLive>(
        runRoute({ id: cell.run_id, store: this._store() }, `/cells/${cell.seq}`)
      );
    } catch (error) {
      this._header.node.textContent = `run ${cell.run_id}, cell ${cell.seq}: ${String((error as Error).message ?? error)}`;
      this._poller.stop();
      return;
    }
    if (this.isDisposed) {
      return;
    }
    this.node.dataset.status = live.status;
    this.node.dataset.step = live.step === null ? '' : String(live.step);
    this._header.node.textContent = live.running
      ? `run ${live.run_id}, cell ${live.seq} training (this page reopened: the figure is read from the run store every ${DATA_POLL_MS / 1000} s)`
      : `run ${live.run_id}, cell ${live.seq}: ${ENDED[live.status] ?? live.status} (from the run store)`;
    if (!live.running) {
      this._poller.stop();
    }
    await this._draw(live);
  }

  /** Draw the figure in a new plotly renderer, then drop the old one: plotly's renderer draws
   * its first model only. Nothing is redrawn while the step and the status stay the same. */
  private async _draw(live: ICellLive): Promise<void> {
    const key = `${live.step}/${live.status}`;
    if (key === this._drawn) {
      return;
    }
    const plot = this._renderer(PLOTLY_MIME);
    if (!plot) {
      this._header.node.textContent += ' (install plotly in the Jupyter server to see its figure)';
      return;
    }
    this._drawn = key;
    (this.layout as PanelLayout).addWidget(plot);
    await plot.renderModel(mimeModel({ [PLOTLY_MIME]: live.figure }));
    this._plot?.dispose();
    this._plot = plot;
  }
}

/** Let the notebook's outputs of CELL_MIME render as a CellView. */
export function registerCellView(panel: NotebookPanel): void {
  panel.content.rendermime.addFactory(
    { safe: true, mimeTypes: [CELL_MIME], createRenderer: () => new CellView(panel) },
    CELL_RANK
  );
}
