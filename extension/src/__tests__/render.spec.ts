// @vitest-environment happy-dom
import { describe, expect, it, vi } from 'vitest';

import { apiErrorFrom } from '../errors';
import { describeFailure } from '../model';
import { renderClusters, renderGpus, renderProblem, renderRuns, sparkline } from '../render';
import type { IRunSummary } from '../types';

const run = (id: number, extra: Partial<IRunSummary> = {}): IRunSummary => ({
  id,
  name: null,
  status: 'running',
  created_at: 1,
  ended_at: null,
  world_size: 2,
  backend: 'gloo',
  cluster_id: null,
  notebook: null,
  n_cells: 1,
  last_step: null,
  global_batch_size: null,
  throughput: null,
  scaling_efficiency: null,
  b_simple: null,
  loss: null,
  sparkline: [],
  ...extra
});

describe('rendering', () => {
  it('shows empty states that say what to do', () => {
    expect(renderClusters({ clusters: [] }, vi.fn()).textContent).toMatch(/%dtrain start/);
    expect(renderRuns({ store_exists: false, total: 0, runs: [] }, vi.fn()).textContent).toMatch(
      /No runs yet/
    );
    expect(renderGpus({ available: false, reason: null, gpus: [] }).textContent).toMatch(/CPU mode/);
  });

  it('says when the server extension is missing', () => {
    const node = renderProblem(describeFailure(apiErrorFrom(404, 'Not Found')));
    expect(node.textContent).toMatch(/Server extension missing/);
    expect(node.getAttribute('role')).toBe('alert');
  });

  it('renders a run with its figures and a loss sparkline, and reports on click', () => {
    const onReport = vi.fn();
    const node = renderRuns(
      {
        store_exists: true,
        total: 1,
        runs: [
          run(3, {
            last_step: 99,
            throughput: 1234.5,
            scaling_efficiency: 0.93,
            b_simple: 321,
            loss: 0.5,
            sparkline: [
              [0, 2],
              [99, 0.5]
            ],
            sparkline_colour: '#1f77b4'
          })
        ]
      },
      onReport
    );
    const card = node.querySelector('[data-run-id="3"]');
    expect(card?.querySelector('[data-stat="throughput"]')?.textContent).toBe('throughput1.2k samples/s');
    expect(card?.querySelector('[data-stat="efficiency"]')?.textContent).toContain('93%');
    expect(card?.querySelector('polyline')?.getAttribute('points')).toBe('1,1 119,27');
    // the loss in its colour in every figure (dtwork/plots/palette.py)
    expect(card?.querySelector('polyline')?.getAttribute('style')).toBe('stroke: #1f77b4');
    (card?.querySelector('.dtwork-ReportLink') as HTMLElement).click();
    expect(onReport).toHaveBeenCalledWith(expect.objectContaining({ id: 3 }));
  });

  it("groups a search's trial runs under its header with its tally, other runs apart", () => {
    const group = {
      id: 2,
      label: 'sweep.yaml',
      searcher: 'grid',
      status: 'running',
      metric: 'val_loss',
      best: 0.25,
      trials: 4,
      running: 1,
      stopped: 1,
      done: 1,
      failed: 0,
      run_ids: [5, 6, 8]
    };
    const node = renderRuns(
      { store_exists: true, total: 5, runs: [run(9), run(8), run(7), run(6), run(5)], searches: [group] },
      vi.fn()
    );
    const cards = [...node.children].map(
      c => c.getAttribute('data-run-id') ?? `search ${c.getAttribute('data-search-id')}`
    );
    expect(cards).toEqual(['9', 'search 2', '7']);
    const search = node.querySelector('[data-search-id="2"]');
    expect(search?.querySelector('.dtwork-Card-title')?.textContent).toBe('Search #2 sweep.yaml (grid)');
    expect(search?.querySelector('.dtwork-Search-tally')?.textContent).toBe(
      'best val_loss 0.25 · 1 running · 1 stopped · 1 done'
    );
    const trials = [...(search?.querySelectorAll('[data-run-id]') ?? [])].map(c =>
      c.getAttribute('data-run-id')
    );
    expect(trials).toEqual(['5', '6', '8']);
  });

  it('says where a run diverged, and nothing for one that did not', () => {
    const node = renderRuns(
      {
        store_exists: true,
        total: 2,
        runs: [run(5, { diverged: 'diverged at step 300 (loss nan)' }), run(4)]
      },
      vi.fn()
    );
    const said = node.querySelector('[data-run-id="5"] .dtwork-Diverged');
    expect(said?.textContent).toBe('diverged at step 300 (loss nan)');
    expect(said?.getAttribute('role')).toBe('status');
    expect(node.querySelector('[data-run-id="4"] .dtwork-Diverged')).toBeNull();
  });

  it("shows an adaptive run's batch trajectory, the steps on hover, and nothing for other runs", () => {
    const node = renderRuns(
      {
        store_exists: true,
        total: 2,
        runs: [
          run(7, {
            adaptive_batch: {
              changes: [
                [20, 16],
                [60, 64],
                [140, 256]
              ],
              n_changes: 3,
              global_batch: 256,
              lr_factor: 3.4567
            }
          }),
          run(6, { adaptive_batch: null })
        ]
      },
      vi.fn()
    );
    const line = node.querySelector('[data-run-id="7"] .dtwork-Adaptive') as HTMLElement;
    expect(line.textContent).toBe('batch 16 → 64 → 256 · LR ×3.46');
    expect(line.title.split('\n').slice(1)).toEqual(['step 20: 16', 'step 60: 64', 'step 140: 256']);
    expect(node.querySelector('[data-run-id="7"] [data-stat="batch"]')?.textContent).toBe('batch256');
    expect(node.querySelector('[data-run-id="6"] .dtwork-Adaptive')).toBeNull();
    expect(node.querySelector('[data-run-id="6"] [data-stat="batch"]')).toBeNull();
  });

  it('keeps a long batch trajectory short: the first batch, then the latest', () => {
    const changes = Array.from({ length: 16 }, (_, i): [number, number] => [i * 10, 16 * (i + 1)]);
    const node = renderRuns(
      {
        store_exists: true,
        total: 1,
        runs: [run(8, { adaptive_batch: { changes, n_changes: 40, global_batch: 256, lr_factor: null } })]
      },
      vi.fn()
    );
    const line = node.querySelector('.dtwork-Adaptive') as HTMLElement;
    expect(line.textContent).toBe('batch 16 → … → 208 → 224 → 240 → 256 · LR —');
    expect(line.title).toMatch(/step 150: 256\n\(24 more change\(s\) not listed\)$/);
  });

  it('caps the runs shown and counts the rest', () => {
    const runs = Array.from({ length: 12 }, (_, i) => run(12 - i));
    const node = renderRuns({ store_exists: true, total: 12, runs }, vi.fn());
    expect(node.querySelectorAll('.dtwork-Run')).toHaveLength(10);
    expect(node.textContent).toMatch(/2 older run\(s\)/);
  });

  it('renders a cluster with one row per rank and a stop button', () => {
    const onStop = vi.fn();
    const ranks = [0, 1].map(r => ({
      rank: r,
      hostname: 'h',
      local_rank: r,
      device: 'cuda:' + r,
      gpu_name: 'H100',
      pid: 7 + r,
      engine_id: r
    }));
    const node = renderClusters(
      {
        clusters: [
          {
            id: 'dtwork-1-abcdef',
            state: 'running',
            n: 2,
            backend: 'nccl',
            profile: null,
            master: null,
            kernel_pid: 1,
            kernel_host: 'h',
            kernel_alive: true,
            notebook: null,
            started_at: null,
            ranks,
            pids: [],
            keep: null,
            keep_left: null
          }
        ]
      },
      onStop
    );
    expect(node.querySelectorAll('tbody tr')).toHaveLength(2);
    expect(node.querySelector('[data-rank="1"]')?.textContent).toContain('cuda:1 (H100)');
    (node.querySelector('.dtwork-StopButton') as HTMLElement).click();
    expect(onStop).toHaveBeenCalledOnce();
  });

  it('names the notebook of each run, and keeps runs of two stores with the same id apart', () => {
    const group = {
      id: 1,
      store: 'sub',
      label: 'sweep.yaml',
      searcher: 'grid',
      status: 'running',
      metric: 'loss',
      best: null,
      trials: 2,
      running: 1,
      stopped: 0,
      done: 0,
      failed: 0,
      run_ids: [1]
    };
    const node = renderRuns(
      {
        store_exists: true,
        total: 2,
        runs: [run(1, { store: 'sub', notebook: 'sub/mnist.ipynb' }), run(1, { store: '' })],
        searches: [group],
        notes: ['the search for run stores stopped after 2000 folders']
      },
      vi.fn()
    );
    const search = node.querySelector('[data-search-id="1"][data-store="sub"]');
    expect(search?.querySelector('.dtwork-Notebook')?.textContent).toBe('notebook sub/mnist.ipynb');
    // the default store's run 1 is not the search's trial
    const apart = node.querySelector(':scope > [data-run-id="1"][data-store=""]');
    expect(apart?.querySelector('.dtwork-Notebook')?.textContent).toBe('no notebook (a script)');
    expect(node.querySelector('.dtwork-Note')?.textContent).toMatch(/stopped after 2000 folders/);
  });

  it("marks a script's cluster and offers a quieter Stop… than a notebook's", () => {
    const cluster = {
      id: 'dtwork-9-script',
      state: 'running',
      n: 2,
      backend: 'gloo',
      profile: null,
      master: null,
      kernel_pid: 77,
      kernel_host: 'h',
      kernel_alive: true,
      notebook: null,
      origin: 'script',
      program: 'train.py',
      started_at: null,
      ranks: [],
      pids: [],
      keep: null,
      keep_left: null
    };
    const mine = {
      ...cluster,
      id: 'dtwork-8-nbook',
      notebook: 'mnist.ipynb',
      origin: 'notebook',
      program: null
    };
    const node = renderClusters({ clusters: [cluster, mine] }, vi.fn());
    const script = node.querySelector('[data-cluster-id="dtwork-9-script"]');
    expect(script?.getAttribute('data-origin')).toBe('script');
    expect(script?.querySelector('.dtwork-Tag')?.textContent).toBe('script');
    expect(script?.querySelector('.dtwork-Meta')?.textContent).toBe('script train.py · process 77 on h');
    const stop = script?.querySelector('.dtwork-StopButton') as HTMLElement;
    expect(stop.textContent).toBe('Stop…');
    expect(stop.classList.contains('jp-mod-warn')).toBe(false);
    const own = node.querySelector('[data-cluster-id="dtwork-8-nbook"]');
    expect(own?.querySelector('.dtwork-Tag')).toBeNull();
    expect(own?.querySelector('.dtwork-StopButton')?.textContent).toBe('Stop');
    expect(own?.querySelector('.dtwork-Meta')?.textContent).toBe('notebook mnist.ipynb · kernel 77 on h');
  });

  it('renders GPU telemetry', () => {
    const node = renderGpus({
      available: true,
      reason: null,
      gpus: [
        {
          index: 0,
          name: 'H100',
          uuid: null,
          driver: null,
          utilization: 87,
          memory_used_mb: 1024,
          memory_total_mb: 81920,
          temperature_c: 61,
          power_w: null
        }
      ]
    });
    expect(node.textContent).toContain('GPU 0 · H100');
    expect(node.querySelector('[data-stat="memory"]')?.textContent).toContain('1.0 / 80.0 GiB');
    expect(node.querySelector('[data-stat="power"]')?.textContent).toContain('—');
  });

  it('says "no loss yet" without a curve', () => {
    expect(sparkline([]).textContent).toBe('no loss yet');
  });
});
