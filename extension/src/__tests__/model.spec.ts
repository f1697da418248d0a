import { describe, expect, it } from 'vitest';

import { SERVER_MISSING_MESSAGE } from '../constants';
import { ApiError, apiErrorFrom } from '../errors';
import {
  clusterHeadline,
  clusterOwner,
  compact,
  DASH,
  describeFailure,
  formatBSimple,
  formatEfficiency,
  formatLoss,
  formatMemory,
  formatThroughput,
  gpuAbsentMessage,
  noRunsMessage,
  runRoute,
  sparklinePoints,
  stateClass
} from '../model';
import type { IClusterInfo, SparkPoint } from '../types';

describe('formatting', () => {
  it('formats throughput in samples/s, compactly', () => {
    expect(formatThroughput(0)).toBe('0 samples/s');
    expect(formatThroughput(3.14159)).toBe('3.1 samples/s');
    expect(formatThroughput(950.4)).toBe('950 samples/s');
    expect(formatThroughput(1234.5)).toBe('1.2k samples/s');
    expect(formatThroughput(45678)).toBe('46k samples/s');
    expect(formatThroughput(2_500_000)).toBe('2.5M samples/s');
  });

  it('shows a dash for unknown or non-finite values', () => {
    for (const value of [null, undefined, NaN, Infinity]) {
      expect(formatThroughput(value)).toBe(DASH);
      expect(formatEfficiency(value)).toBe(DASH);
      expect(formatBSimple(value)).toBe(DASH);
      expect(formatLoss(value)).toBe(DASH);
    }
  });

  it('formats efficiency as a percentage and B_simple as a batch size', () => {
    expect(formatEfficiency(0.934)).toBe('93%');
    expect(formatEfficiency(1)).toBe('100%');
    expect(formatBSimple(321)).toBe('321');
    expect(formatBSimple(4096)).toBe('4.1k');
    expect(compact(-1500)).toBe('-1.5k');
  });

  it('formats loss with four significant digits', () => {
    expect(formatLoss(2.302585)).toBe('2.303');
    expect(formatLoss(0)).toBe('0');
    expect(formatLoss(0.00012345)).toBe('1.23e-4');
  });

  it('formats GPU memory in GiB', () => {
    expect(formatMemory(1024, 81920)).toBe('1.0 / 80.0 GiB');
    expect(formatMemory(null, 81920)).toBe('80.0 GiB');
    expect(formatMemory(null, null)).toBe(DASH);
  });
});

describe('sparkline points', () => {
  const parse = (line: string): number[][] => line.split(' ').map(p => p.split(',').map(Number));

  it('spans the box, highest loss at the top', () => {
    const pts: SparkPoint[] = [
      [0, 2],
      [5, 1],
      [10, 0]
    ];
    const xy = parse(sparklinePoints(pts, 100, 20, 0));
    expect(xy).toEqual([
      [0, 0],
      [50, 10],
      [100, 20]
    ]);
  });

  it('respects the padding', () => {
    const xy = parse(
      sparklinePoints(
        [
          [0, 1],
          [1, 0]
        ],
        100,
        20,
        2
      )
    );
    expect(xy[0]).toEqual([2, 2]);
    expect(xy[1]).toEqual([98, 18]);
  });

  it('draws nothing for fewer than two finite points', () => {
    expect(sparklinePoints([], 100, 20)).toBe('');
    expect(sparklinePoints([[1, 1]], 100, 20)).toBe('');
    expect(
      sparklinePoints(
        [
          [1, 1],
          [2, NaN]
        ],
        100,
        20
      )
    ).toBe('');
  });

  it('draws a flat curve at mid-height', () => {
    const xy = parse(
      sparklinePoints(
        [
          [0, 3],
          [1, 3],
          [2, 3]
        ],
        100,
        20,
        0
      )
    );
    expect(xy.map(p => p[1])).toEqual([10, 10, 10]);
  });

  it('stays inside the box for any input', () => {
    const pts: SparkPoint[] = Array.from({ length: 50 }, (_, i) => [i * 7, Math.sin(i) * 1e6]);
    for (const [x, y] of parse(sparklinePoints(pts, 120, 28))) {
      expect(x).toBeGreaterThanOrEqual(0);
      expect(x).toBeLessThanOrEqual(120);
      expect(y).toBeGreaterThanOrEqual(0);
      expect(y).toBeLessThanOrEqual(28);
    }
  });
});

describe('empty states', () => {
  it('explains where runs come from, with or without a store', () => {
    expect(noRunsMessage({ store_exists: false, total: 0, runs: [] })).toMatch(/first %%dtrain cell/);
    expect(noRunsMessage({ store_exists: true, total: 0, runs: [] })).toMatch(/holds no runs yet/);
  });

  it('says the machine runs in CPU mode without GPUs', () => {
    expect(gpuAbsentMessage({ available: false, reason: null, gpus: [] })).toMatch(/CPU mode/);
    const reason = 'NVML sees no GPU (no NVIDIA driver or device): this machine runs in CPU mode';
    expect(gpuAbsentMessage({ available: false, reason, gpus: [] })).toBe(reason);
    expect(gpuAbsentMessage({ available: false, reason: 'NVML failed: OSError', gpus: [] })).toBe(
      'NVML failed: OSError: this machine runs in CPU mode'
    );
  });
});

describe('failure states', () => {
  it('takes a 404 page (not a dtwork JSON error) as the server extension missing', () => {
    const problem = describeFailure(apiErrorFrom(404, '<html><body>404 : Not Found</body></html>'));
    expect(problem).toEqual({ kind: 'server-missing', message: SERVER_MISSING_MESSAGE });
    expect(problem.message).toMatch(/jupyter server extension list/);
  });

  it("keeps dtwork's own 404s (unknown ids) as plain errors", () => {
    const error = apiErrorFrom(404, JSON.stringify({ error: 'no run 9 in the run store' }));
    expect(error.fromDtwork).toBe(true);
    expect(describeFailure(error)).toEqual({ kind: 'error', message: 'no run 9 in the run store' });
  });

  it('reports other failures with their message', () => {
    expect(describeFailure(apiErrorFrom(501, '{"error": "report export is not available"}'))).toEqual({
      kind: 'error',
      message: 'report export is not available'
    });
    expect(describeFailure(apiErrorFrom(502, 'Bad gateway')).message).toBe('the server answered HTTP 502');
    expect(describeFailure(new ApiError(0, 'the Jupyter server cannot be reached', false)).kind).toBe(
      'error'
    );
    expect(describeFailure(new TypeError('boom'))).toEqual({ kind: 'error', message: 'boom' });
  });
});

describe('clusters', () => {
  const cluster: IClusterInfo = {
    id: 'dtwork-1-abcdef',
    state: 'running',
    n: 2,
    backend: 'gloo',
    profile: null,
    master: '127.0.0.1:29500',
    kernel_pid: 4242,
    kernel_host: 'host-a',
    kernel_alive: true,
    notebook: 'train.ipynb',
    started_at: 1,
    ranks: [0, 1].map(rank => ({
      rank,
      hostname: 'host-a',
      local_rank: rank,
      device: 'cpu',
      gpu_name: null,
      pid: 100 + rank,
      engine_id: rank
    })),
    pids: [100, 101],
    keep: null,
    keep_left: null
  };

  it('summarises ranks, backend and hosts', () => {
    expect(clusterHeadline(cluster)).toBe('2 ranks · gloo · 1 host');
    expect(clusterHeadline({ ...cluster, ranks: [], n: 1 })).toBe('1 rank · gloo');
  });

  it('names the owning notebook and kernel', () => {
    expect(clusterOwner(cluster)).toBe('notebook train.ipynb · kernel 4242 on host-a');
    expect(clusterOwner({ ...cluster, kernel_alive: false, notebook: null })).toBe(
      'kernel 4242 on host-a (gone)'
    );
  });

  it('says how long a kept cluster outlives its kernel, and the time left once it is gone', () => {
    expect(clusterOwner({ ...cluster, keep: 7200 })).toBe(
      'notebook train.ipynb · kernel 4242 on host-a · kept 2 h after its kernel ends'
    );
    expect(clusterOwner({ ...cluster, keep: 7200, keep_left: 3690, kernel_alive: false })).toBe(
      'notebook train.ipynb · kernel 4242 on host-a (gone) · kept: 1 h 1 min left for %dtrain attach'
    );
  });

  it("names a run's route with its store, the default store's without", () => {
    expect(runRoute({ id: 3 }, '/report')).toBe('runs/3/report');
    expect(runRoute({ id: 3, store: '' })).toBe('runs/3');
    expect(runRoute({ id: 3, store: 'a b/c' }, '/cells/2')).toBe('runs/3/cells/2?store=a%20b%2Fc');
  });

  it('maps states to CSS modifiers', () => {
    expect(stateClass('running')).toBe('dtwork-mod-running');
    expect(stateClass('<script>')).toBe('dtwork-mod-unknown');
    expect(stateClass(null)).toBe('dtwork-mod-unknown');
  });
});
