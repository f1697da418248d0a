/**
 * The panel's data handling: formatting, sparklines, empty states, failure states.
 * Pure functions with no JupyterLab imports, so that they are unit-tested without a browser.
 */

import { MAX_BATCHES_SHOWN, SERVER_MISSING_MESSAGE } from './constants';
import { ApiError } from './errors';
import type { IAdaptiveBatch, IClusterInfo, IGpusReply, IRunsReply, ISearchGroup, SparkPoint } from './types';

export const DASH = '—';

/** What went wrong when the panel could not read a route. */
export type Problem = { kind: 'server-missing'; message: string } | { kind: 'error'; message: string };

/**
 * Classify a failed request. A 404 that is not dtwork's own JSON error means the
 * /dtwork/ routes do not exist: the server extension is missing.
 */
export function describeFailure(error: unknown): Problem {
  if (error instanceof ApiError) {
    if (error.status === 404 && !error.fromDtwork) {
      return { kind: 'server-missing', message: SERVER_MISSING_MESSAGE };
    }
    return { kind: 'error', message: error.message };
  }
  return { kind: 'error', message: error instanceof Error ? error.message : String(error) };
}

function isNumber(value: number | null | undefined): value is number {
  return typeof value === 'number' && Number.isFinite(value);
}

/** Compact number: 950, 9.5k, 1.2M. */
export function compact(value: number): string {
  const abs = Math.abs(value);
  if (abs >= 1e6) {
    return `${(value / 1e6).toFixed(abs >= 1e7 ? 0 : 1)}M`;
  }
  if (abs >= 1e3) {
    return `${(value / 1e3).toFixed(abs >= 1e4 ? 0 : 1)}k`;
  }
  if (abs >= 10 || value === 0) {
    return value.toFixed(0);
  }
  return value.toFixed(1);
}

/** Throughput in samples/s: "1.2k samples/s"; a dash when unknown. */
export function formatThroughput(samplesPerSec: number | null | undefined): string {
  return isNumber(samplesPerSec) ? `${compact(samplesPerSec)} samples/s` : DASH;
}

/** Scaling efficiency E(n) as a percentage: 0.934 -> "93%". */
export function formatEfficiency(efficiency: number | null | undefined): string {
  return isNumber(efficiency) ? `${Math.round(efficiency * 100)}%` : DASH;
}

/** The gradient noise scale B_simple, a batch size: "1.2k". */
export function formatBSimple(bSimple: number | null | undefined): string {
  return isNumber(bSimple) ? compact(bSimple) : DASH;
}

/** A loss value with 4 significant digits. */
/** A search's tally as its group's header says it: "best val_loss 0.01 · 1 running · 0 stopped · 2 done". */
export function searchTally(group: ISearchGroup): string {
  const failed = group.failed ? ` · ${group.failed} failed` : '';
  const best = `best ${group.metric ?? 'metric'} ${formatLoss(group.best)}`;
  return `${best} · ${group.running} running · ${group.stopped} stopped · ${group.done} done${failed}`;
}

export function formatLoss(loss: number | null | undefined): string {
  if (!isNumber(loss)) {
    return DASH;
  }
  return Math.abs(loss) >= 1e-3 || loss === 0
    ? Number(loss.toPrecision(4)).toString()
    : loss.toExponential(2);
}

export function formatStep(step: number | null | undefined): string {
  return isNumber(step) ? String(step) : DASH;
}

/** GPU memory from MiB: "12.3 / 80.0 GiB". */
export function formatMemory(usedMb: number | null, totalMb: number | null): string {
  const gib = (mb: number): string => (mb / 1024).toFixed(1);
  if (isNumber(usedMb) && isNumber(totalMb)) {
    return `${gib(usedMb)} / ${gib(totalMb)} GiB`;
  }
  if (isNumber(totalMb)) {
    return `${gib(totalMb)} GiB`;
  }
  return DASH;
}

export function formatUnit(value: number | null | undefined, unit: string, digits = 0): string {
  return isNumber(value) ? `${value.toFixed(digits)}${unit}` : DASH;
}

/**
 * SVG polyline points for a loss sparkline in a width x height box (y grows downwards).
 * Non-finite points are dropped; fewer than two points give ''; a flat curve is drawn
 * at mid-height.
 */
export function sparklinePoints(
  points: readonly SparkPoint[],
  width: number,
  height: number,
  pad = 1
): string {
  const pts = points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
  if (pts.length < 2) {
    return '';
  }
  const xs = pts.map(p => p[0]);
  const ys = pts.map(p => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const sx = (x: number): number =>
    x1 === x0 ? width / 2 : pad + ((x - x0) / (x1 - x0)) * (width - 2 * pad);
  const sy = (y: number): number =>
    y1 === y0 ? height / 2 : pad + ((y1 - y) / (y1 - y0)) * (height - 2 * pad);
  return pts.map(([x, y]) => `${round2(sx(x))},${round2(sy(y))}`).join(' ');
}

/** A global batch, in full: "1024". */
export function formatBatch(batch: number | null | undefined): string {
  return isNumber(batch) ? String(Math.round(batch)) : DASH;
}

/** An LR factor: "×1.83". */
export function formatFactor(factor: number | null | undefined): string {
  return isNumber(factor) ? `×${Number(factor.toPrecision(3))}` : DASH;
}

/**
 * An adaptive run's batch trajectory as its card shows it: the text "batch 16 → 64 → 256"
 * (the first batch, "…", then the latest when there are more than MAX_BATCHES_SHOWN) and a
 * title naming the step of each change, for hover.
 */
export function batchTrajectory(adaptive: IAdaptiveBatch): { text: string; title: string } {
  const batches = adaptive.changes.map(([, batch]) => formatBatch(batch));
  const shown =
    batches.length > MAX_BATCHES_SHOWN
      ? [batches[0], '…', ...batches.slice(batches.length - MAX_BATCHES_SHOWN + 1)]
      : batches;
  const steps = adaptive.changes.map(([step, batch]) => `step ${step}: ${formatBatch(batch)}`);
  const omitted = adaptive.n_changes - adaptive.changes.length;
  const tail = omitted > 0 ? [`(${omitted} more change(s) not listed)`] : [];
  return {
    text: `batch ${shown.join(' → ')}`,
    title: ['Global batch at each change of the adaptive batch:', ...steps, ...tail].join('\n')
  };
}

function round2(v: number): string {
  return (Math.round(v * 100) / 100).toString();
}

/** The empty state of the clusters section. */
export const NO_CLUSTERS =
  'No cluster is running. In a notebook run %load_ext dtwork then %dtrain start ' +
  '(the "Insert start cell" button writes that cell for you).';

/** The empty state of the runs section, by whether a run store exists yet. */
export function noRunsMessage(reply: IRunsReply): string {
  return reply.store_exists
    ? 'The run store holds no runs yet: run a %%dtrain cell to record one.'
    : 'No runs yet. A run is recorded at the first %%dtrain cell of a cluster, ' +
        'in .dtwork/runs.sqlite beside the notebook.';
}

/** The line the GPU section shows without GPUs (the server's reason when it gives one). */
export function gpuAbsentMessage(reply: IGpusReply): string {
  const why = reply.reason ?? 'NVML sees no GPU';
  return /CPU mode/.test(why) ? why : `${why}: this machine runs in CPU mode`;
}

/** "2 ranks · gloo · 1 host" */
export function clusterHeadline(cluster: IClusterInfo): string {
  const ranks = cluster.ranks.length || cluster.n || 0;
  const hosts = new Set(cluster.ranks.map(r => r.hostname ?? '?')).size;
  const parts = [`${ranks} rank${ranks === 1 ? '' : 's'}`, cluster.backend ?? 'backend ?'];
  if (hosts > 0) {
    parts.push(`${hosts} host${hosts === 1 ? '' : 's'}`);
  }
  return parts.join(' · ');
}

/** 90 -> "1 min 30 s", 7200 -> "2 h": a keep time as people say it (as the kernel says it). */
export function duration(seconds: number): string {
  const s = Math.round(seconds);
  const parts: [number, string][] = [
    [Math.floor(s / 86400), 'd'],
    [Math.floor((s % 86400) / 3600), 'h'],
    [Math.floor((s % 3600) / 60), 'min'],
    [s % 60, 's']
  ];
  const said = parts.filter(([v]) => v > 0).map(([v, u]) => `${v} ${u}`);
  return said.slice(0, 2).join(' ') || '0 s';
}

/** Whether a cluster was started by a program outside any notebook (a script's dtwork.start()). */
export function isScript(cluster: IClusterInfo): boolean {
  return cluster.origin === 'script';
}

/** "notebook train.ipynb · kernel 1234" (with "(gone)" when the kernel died; a kept cluster's time);
 * a script's: "script train.py · process 1234". */
export function clusterOwner(cluster: IClusterInfo): string {
  const parts: string[] = [];
  if (cluster.notebook) {
    parts.push(`notebook ${cluster.notebook}`);
  } else if (isScript(cluster)) {
    parts.push(`script ${cluster.program ?? '(no notebook)'}`);
  }
  if (cluster.kernel_pid !== null) {
    const host = cluster.kernel_host ? ` on ${cluster.kernel_host}` : '';
    const what = isScript(cluster) ? 'process' : 'kernel';
    parts.push(`${what} ${cluster.kernel_pid}${host}${cluster.kernel_alive ? '' : ' (gone)'}`);
  }
  if (cluster.keep) {
    parts.push(
      cluster.keep_left !== null && !cluster.kernel_alive
        ? `kept: ${duration(cluster.keep_left)} left for %dtrain attach`
        : `kept ${duration(cluster.keep)} after its kernel ends`
    );
  }
  return parts.length ? parts.join(' · ') : 'owner unknown';
}

/** The route of one run (`suffix`: '/metrics', '/report', ...), naming its store when not the default. */
export function runRoute(run: { id: number; store?: string }, suffix = ''): string {
  const store = run.store ? `?store=${encodeURIComponent(run.store)}` : '';
  return `runs/${run.id}${suffix}${store}`;
}

/** One run across stores: its store's key and its id. */
export function runKey(run: { id: number; store?: string }): string {
  return `${run.store ?? ''}#${run.id}`;
}

/** "notebook sub/train.ipynb", or where a run without a notebook was recorded. */
export function runOrigin(run: { notebook: string | null; store?: string }): string {
  if (run.notebook) {
    return `notebook ${run.notebook}`;
  }
  return run.store ? `no notebook · store in ${run.store}/` : 'no notebook (a script)';
}

/** A CSS modifier for a run or cluster state: running, completed, failed, ... */
export function stateClass(state: string | null): string {
  const known = ['running', 'starting', 'completed', 'failed', 'interrupted', 'stopped'];
  return `dtwork-mod-${state && known.includes(state) ? state : 'unknown'}`;
}
