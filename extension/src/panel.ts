/** The "Distributed training" sidebar: clusters, runs and GPUs, polled while visible. */

import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import type { LabIcon } from '@jupyterlab/ui-components';
import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { DATA_POLL_MS, GPU_POLL_MS, PANEL_ID, PANEL_TITLE } from './constants';
import { el } from './dom';
import { describeFailure, isScript, Problem, runRoute } from './model';
import { Poller } from './poller';
import { renderClusters, renderGpus, renderProblem, renderRuns } from './render';
import { requestAPI } from './request';
import { Section } from './section';
import type {
  IClusterInfo,
  IClustersReply,
  IGpusReply,
  IHealth,
  IReportReply,
  IRunSummary,
  IRunsReply,
  IStopReply
} from './types';

export interface IPanelOptions {
  icon: LabIcon;
  /** Insert the %load_ext / %dtrain start cell into the active notebook. */
  insertStartCell: () => void;
  /** Open a notebook by its path relative to the Jupyter root. */
  openNotebook: (path: string) => Promise<unknown>;
}

export class DtworkPanel extends Widget {
  private readonly _banner = el('div', { className: 'dtwork-Banner' });
  private readonly _version = el('span', { className: 'dtwork-Version' });
  private readonly _clusters = new Section('clusters', 'Clusters');
  private readonly _runs = new Section('runs', 'Runs');
  private readonly _gpus = new Section('gpus', 'GPUs');
  private readonly _dataPoller = new Poller(() => this.refreshData(), DATA_POLL_MS);
  private readonly _gpuPoller = new Poller(() => this.refreshGpus(), GPU_POLL_MS);
  /** Ask the server to look for run stores again at the next read (the panel was just shown). */
  private _rescan = true;

  constructor(private readonly _options: IPanelOptions) {
    super();
    this.id = PANEL_ID;
    this.title.icon = _options.icon;
    this.title.caption = PANEL_TITLE;
    this.addClass('dtwork-Panel');
    const insert = el('button', {
      className: 'jp-Button jp-mod-styled jp-mod-accept dtwork-InsertButton',
      text: 'Insert start cell',
      title: 'Insert a %load_ext dtwork / %dtrain start cell into the active notebook',
      onClick: () => this._options.insertStartCell()
    });
    const header = el('header', { className: 'dtwork-Header' }, el('h2', { text: PANEL_TITLE }), insert);
    this.node.append(
      header,
      this._banner,
      this._clusters.node,
      this._runs.node,
      this._gpus.node,
      el('footer', {}, this._version)
    );
  }

  /** Read clusters and runs (and the server's version, once) and show them. */
  async refreshData(): Promise<void> {
    const [clusters, runs, health] = await Promise.allSettled([
      requestAPI<IClustersReply>('clusters'),
      requestAPI<IRunsReply>(this._rescan ? 'runs?rescan=1' : 'runs'),
      this._version.textContent ? Promise.resolve(null) : requestAPI<IHealth>('health')
    ]);
    this._rescan = false;
    const problems: Problem[] = [];
    if (clusters.status === 'fulfilled') {
      this._clusters.show(JSON.stringify(clusters.value), () =>
        renderClusters(clusters.value, c => void this._stop(c))
      );
    } else {
      problems.push(this._fail(this._clusters, clusters.reason));
    }
    if (runs.status === 'fulfilled') {
      this._runs.show(JSON.stringify(runs.value), () => renderRuns(runs.value, r => void this._report(r)));
    } else {
      problems.push(this._fail(this._runs, runs.reason));
    }
    if (health.status === 'fulfilled' && health.value) {
      this._version.textContent = `dtwork ${health.value.version}`;
    }
    this._setUnavailable(problems.find(p => p.kind === 'server-missing') ?? null);
  }

  async refreshGpus(): Promise<void> {
    try {
      const reply = await requestAPI<IGpusReply>('gpus');
      this._gpus.show(JSON.stringify(reply), () => renderGpus(reply));
    } catch (error) {
      const problem = this._fail(this._gpus, error);
      if (problem.kind === 'server-missing') {
        this._setUnavailable(problem);
      }
    }
  }

  private _fail(section: Section, error: unknown): Problem {
    const problem = describeFailure(error);
    section.show(`problem:${problem.kind}:${problem.message}`, () => renderProblem(problem));
    return problem;
  }

  /** Say so, once, at the top when the server extension is missing; hide the sections. */
  private _setUnavailable(problem: Problem | null): void {
    this.toggleClass('dtwork-mod-unavailable', problem !== null);
    this._banner.replaceChildren(...(problem ? [renderProblem(problem)] : []));
  }

  private async _stop(cluster: IClusterInfo): Promise<void> {
    const engines = `The ${cluster.ranks.length || (cluster.n ?? '')} engine(s) and the controller of ${cluster.id} will be killed.`;
    const script = isScript(cluster);
    const result = await showDialog({
      title: script ? "Stop a script's cluster?" : 'Stop this cluster?',
      body: script
        ? `${cluster.id} was started by a script (${cluster.program ?? 'a program'}, process ${cluster.kernel_pid ?? '?'}), not by a notebook. ${engines} The script's training fails with it.`
        : `${engines} The notebook's kernel keeps running; its cluster will need %dtrain start again.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop' })]
    });
    if (!result.button.accept) {
      return;
    }
    try {
      const reply = await requestAPI<IStopReply>(`clusters/${encodeURIComponent(cluster.id)}/stop`, {
        method: 'POST'
      });
      Notification.success(`Stopped ${reply.stopped}: ${reply.killed.length} process(es) ended`, {
        autoClose: 4000
      });
    } catch (error) {
      Notification.error(`Could not stop ${cluster.id}: ${describeFailure(error).message}`);
    }
    await this.refreshData();
  }

  private async _report(run: IRunSummary): Promise<void> {
    const id = Notification.emit(`Exporting run #${run.id}…`, 'in-progress', { autoClose: false });
    try {
      const reply = await requestAPI<IReportReply>(runRoute(run, '/report'), { method: 'POST' });
      Notification.update({
        id,
        message: `Run #${run.id} exported to ${reply.path}`,
        type: 'success',
        autoClose: 4000
      });
      await this._options.openNotebook(reply.path);
    } catch (error) {
      const message = `Report of run #${run.id} failed: ${describeFailure(error).message}`;
      Notification.update({ id, message, type: 'error', autoClose: false });
    }
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._rescan = true;
    this._dataPoller.start();
    this._gpuPoller.start();
  }

  protected override onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this.isVisible) {
      this._dataPoller.start();
      this._gpuPoller.start();
    }
  }

  protected override onBeforeHide(msg: Message): void {
    super.onBeforeHide(msg);
    this._dataPoller.stop();
    this._gpuPoller.stop();
  }

  protected override onBeforeDetach(msg: Message): void {
    this._dataPoller.stop();
    this._gpuPoller.stop();
    super.onBeforeDetach(msg);
  }

  override dispose(): void {
    this._dataPoller.stop();
    this._gpuPoller.stop();
    super.dispose();
  }
}
