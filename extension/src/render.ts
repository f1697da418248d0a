/** The panel's sections as DOM, from the wire types (pure DOM: unit-testable). */

import { MAX_RUNS_SHOWN, SPARKLINE_HEIGHT, SPARKLINE_WIDTH } from './constants';
import { el, svg } from './dom';
import {
  batchTrajectory,
  clusterHeadline,
  clusterOwner,
  DASH,
  formatBatch,
  formatBSimple,
  formatEfficiency,
  formatFactor,
  formatLoss,
  formatMemory,
  formatStep,
  formatThroughput,
  formatUnit,
  gpuAbsentMessage,
  isScript,
  NO_CLUSTERS,
  noRunsMessage,
  Problem,
  runKey,
  runOrigin,
  searchTally,
  sparklinePoints,
  stateClass
} from './model';
import type {
  IAdaptiveBatch,
  IClusterInfo,
  IClustersReply,
  IGpuInfo,
  IGpusReply,
  IRunSummary,
  IRunsReply,
  ISearchGroup,
  SparkPoint
} from './types';

export function emptyState(message: string): HTMLElement {
  return el('p', { className: 'dtwork-Empty', text: message });
}

export function renderProblem(problem: Problem): HTMLElement {
  const heading = problem.kind === 'server-missing' ? 'Server extension missing' : 'Cannot read dtwork data';
  return el(
    'div',
    { className: `dtwork-Problem dtwork-mod-${problem.kind}`, attrs: { role: 'alert' } },
    el('strong', { text: heading }),
    el('p', { text: problem.message })
  );
}

function badge(state: string | null): HTMLElement {
  return el('span', { className: `dtwork-Badge ${stateClass(state)}`, text: state ?? 'unknown' });
}

function rankRow(rank: IClusterInfo['ranks'][number]): HTMLElement {
  const device = rank.gpu_name ? `${rank.device ?? DASH} (${rank.gpu_name})` : (rank.device ?? DASH);
  return el(
    'tr',
    { data: { rank: String(rank.rank) } },
    el('td', { text: String(rank.rank) }),
    el('td', { text: rank.hostname ?? DASH }),
    el('td', { text: device }),
    el('td', { text: rank.pid === null ? DASH : String(rank.pid) })
  );
}

/** A notebook's cluster: a Stop button. A script's: marked "script", and a quieter "Stop…" whose
 * dialog says the script's training fails (panel.ts): it is another program's, not a notebook's. */
function stopButton(cluster: IClusterInfo, onStop: (c: IClusterInfo) => void): HTMLElement {
  const script = isScript(cluster);
  return el('button', {
    className: `jp-Button jp-mod-styled ${script ? 'dtwork-mod-script' : 'jp-mod-warn'} dtwork-StopButton`,
    text: script ? 'Stop…' : 'Stop',
    title: script
      ? `Cluster ${cluster.id} was started by a script, not a notebook: stopping it ends the script's training`
      : `Stop cluster ${cluster.id}: kill its engines and controller`,
    onClick: () => onStop(cluster)
  });
}

function clusterCard(cluster: IClusterInfo, onStop: (c: IClusterInfo) => void): HTMLElement {
  const head = el(
    'div',
    { className: 'dtwork-Card-head' },
    badge(cluster.state),
    isScript(cluster) ? el('span', { className: 'dtwork-Tag dtwork-mod-script', text: 'script' }) : null,
    el('span', { className: 'dtwork-Card-title', text: clusterHeadline(cluster) }),
    stopButton(cluster, onStop)
  );
  const table = el(
    'table',
    { className: 'dtwork-Ranks' },
    el(
      'thead',
      {},
      el(
        'tr',
        {},
        el('th', { text: 'rank' }),
        el('th', { text: 'host' }),
        el('th', { text: 'device' }),
        el('th', { text: 'pid' })
      )
    ),
    el('tbody', {}, ...cluster.ranks.map(rankRow))
  );
  return el(
    'div',
    {
      className: `dtwork-Card dtwork-Cluster${isScript(cluster) ? ' dtwork-mod-script' : ''}`,
      data: { clusterId: cluster.id, origin: cluster.origin ?? 'notebook' }
    },
    head,
    el('div', { className: 'dtwork-Meta', text: clusterOwner(cluster) }),
    el('div', { className: 'dtwork-Meta dtwork-Id', text: cluster.id }),
    cluster.ranks.length ? table : emptyState('The ranks are still joining the process group.')
  );
}

export function renderClusters(reply: IClustersReply, onStop: (cluster: IClusterInfo) => void): HTMLElement {
  if (!reply.clusters.length) {
    return emptyState(NO_CLUSTERS);
  }
  return el('div', { className: 'dtwork-List' }, ...reply.clusters.map(c => clusterCard(c, onStop)));
}

export function sparkline(points: readonly SparkPoint[], colour?: string): Element {
  const line = sparklinePoints(points, SPARKLINE_WIDTH, SPARKLINE_HEIGHT);
  if (!line) {
    return el('span', { className: 'dtwork-Sparkline dtwork-mod-empty', text: 'no loss yet' });
  }
  return svg(
    'svg',
    {
      class: 'dtwork-Sparkline',
      width: String(SPARKLINE_WIDTH),
      height: String(SPARKLINE_HEIGHT),
      viewBox: `0 0 ${SPARKLINE_WIDTH} ${SPARKLINE_HEIGHT}`,
      role: 'img',
      'aria-label': `loss over ${points.length} points`
    },
    svg('polyline', { points: line, fill: 'none', ...(colour ? { style: `stroke: ${colour}` } : {}) })
  );
}

function stat(label: string, value: string): HTMLElement {
  return el(
    'div',
    { className: 'dtwork-Stat', data: { stat: label } },
    el('span', { className: 'dtwork-Stat-label', text: label }),
    el('span', { className: 'dtwork-Stat-value', text: value })
  );
}

/** An adaptive run's batch trajectory, the steps of its changes on hover. */
function adaptiveLine(adaptive: IAdaptiveBatch): HTMLElement {
  const { text, title } = batchTrajectory(adaptive);
  return el(
    'div',
    { className: 'dtwork-Adaptive', title },
    el('span', { className: 'dtwork-Adaptive-batches', text }),
    el('span', { className: 'dtwork-Adaptive-lr', text: ` · LR ${formatFactor(adaptive.lr_factor)}` })
  );
}

function runCard(run: IRunSummary, onReport: (r: IRunSummary) => void): HTMLElement {
  const title = `#${run.id}${run.name ? ` ${run.name}` : ''}`;
  const ranks = run.world_size ? `${run.world_size} × ${run.backend ?? '?'}` : (run.backend ?? DASH);
  const adaptive = run.adaptive_batch?.changes.length ? run.adaptive_batch : null;
  return el(
    'div',
    { className: 'dtwork-Card dtwork-Run', data: { runId: String(run.id), store: run.store ?? '' } },
    el(
      'div',
      { className: 'dtwork-Card-head' },
      badge(run.status),
      el('span', { className: 'dtwork-Card-title', text: title }),
      el('a', {
        className: 'dtwork-ReportLink',
        text: 'Report',
        title: 'Export this run as a re-runnable notebook and open it',
        attrs: { href: '#', role: 'button' },
        onClick: event => {
          event.preventDefault();
          onReport(run);
        }
      })
    ),
    el('div', { className: 'dtwork-Meta dtwork-Notebook', text: runOrigin(run) }),
    el(
      'div',
      { className: 'dtwork-Stats' },
      stat('step', formatStep(run.last_step)),
      stat('throughput', formatThroughput(run.throughput)),
      stat('efficiency', formatEfficiency(run.scaling_efficiency)),
      stat('B_simple', formatBSimple(run.b_simple)),
      stat('loss', formatLoss(run.loss)),
      stat('ranks', ranks),
      adaptive ? stat('batch', formatBatch(adaptive.global_batch)) : null
    ),
    adaptive ? adaptiveLine(adaptive) : null,
    run.diverged
      ? el('div', { className: 'dtwork-Diverged', text: run.diverged, attrs: { role: 'status' } })
      : null,
    sparkline(run.sparkline, run.sparkline_colour)
  );
}

function searchGroup(
  group: ISearchGroup,
  runs: IRunSummary[],
  onReport: (r: IRunSummary) => void
): HTMLElement {
  return el(
    'div',
    { className: 'dtwork-Search', data: { searchId: String(group.id), store: group.store ?? '' } },
    el(
      'div',
      { className: 'dtwork-Card-head' },
      badge(group.status),
      el('span', {
        className: 'dtwork-Card-title',
        text: `Search #${group.id} ${group.label} (${group.searcher})`
      })
    ),
    el('div', { className: 'dtwork-Meta dtwork-Search-tally', text: searchTally(group) }),
    ...runs.map(r => runCard(r, onReport))
  );
}

/** The runs in order, a search's trial runs together under its header where its newest shown run is. */
function grouped(
  runs: IRunSummary[],
  searches: ISearchGroup[],
  onReport: (r: IRunSummary) => void
): HTMLElement[] {
  // run and search ids are per store: each is known by its store's key with its id
  const searchOf = new Map<string, ISearchGroup>();
  for (const group of searches) {
    group.run_ids.forEach(id => searchOf.set(runKey({ id, store: group.store }), group));
  }
  const out: HTMLElement[] = [];
  const placed = new Set<ISearchGroup>();
  for (const run of runs) {
    const group = searchOf.get(runKey(run));
    if (!group) {
      out.push(runCard(run, onReport));
    } else if (!placed.has(group)) {
      placed.add(group);
      const inStore = runs.filter(r => (r.store ?? '') === (group.store ?? ''));
      const trials = group.run_ids.flatMap(id => inStore.filter(r => r.id === id));
      out.push(searchGroup(group, trials, onReport));
    }
  }
  return out;
}

export function renderRuns(reply: IRunsReply, onReport: (run: IRunSummary) => void): HTMLElement {
  const notes = (reply.notes ?? []).map(note =>
    el('p', { className: 'dtwork-Meta dtwork-Note', text: note })
  );
  if (!reply.runs.length) {
    const empty = emptyState(noRunsMessage(reply));
    return notes.length ? el('div', { className: 'dtwork-List' }, empty, ...notes) : empty;
  }
  const shown = reply.runs.slice(0, MAX_RUNS_SHOWN);
  const more = reply.total - shown.length;
  return el(
    'div',
    { className: 'dtwork-List' },
    ...grouped(shown, reply.searches ?? [], onReport),
    ...notes,
    more > 0
      ? el('p', { className: 'dtwork-Meta', text: `${more} older run(s): %dtrain runs lists them all` })
      : null
  );
}

function gpuCard(gpu: IGpuInfo): HTMLElement {
  const util = gpu.utilization ?? 0;
  const bar = el(
    'div',
    { className: 'dtwork-Bar' },
    el('div', {
      className: 'dtwork-Bar-fill',
      attrs: { style: `width: ${Math.min(100, Math.max(0, util))}%` }
    })
  );
  return el(
    'div',
    { className: 'dtwork-Card dtwork-Gpu', data: { gpuIndex: String(gpu.index) } },
    el(
      'div',
      { className: 'dtwork-Card-head' },
      el('span', { className: 'dtwork-Card-title', text: `GPU ${gpu.index} · ${gpu.name ?? 'unknown'}` })
    ),
    bar,
    el(
      'div',
      { className: 'dtwork-Stats' },
      stat('util', formatUnit(gpu.utilization, '%')),
      stat('memory', formatMemory(gpu.memory_used_mb, gpu.memory_total_mb)),
      stat('temp', formatUnit(gpu.temperature_c, ' °C')),
      stat('power', formatUnit(gpu.power_w, ' W'))
    )
  );
}

export function renderGpus(reply: IGpusReply): HTMLElement {
  if (!reply.available || !reply.gpus.length) {
    return el('p', { className: 'dtwork-Empty dtwork-CpuMode', text: gpuAbsentMessage(reply) });
  }
  return el('div', { className: 'dtwork-List' }, ...reply.gpus.map(gpuCard));
}
