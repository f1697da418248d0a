/**
 * Wire types of the dtwork server extension (dtwork/server/routes.py and data.py).
 * Each mirrors one route's JSON answer; null stands for "not known" (NaN travels as null).
 */

/** matches GET /dtwork/health */
export interface IHealth {
  ok: boolean;
  version: string;
  store_exists: boolean;
}

/** one rank of a cluster; part of GET /dtwork/clusters */
export interface IRankInfo {
  rank: number;
  hostname: string | null;
  local_rank: number | null;
  device: string | null;
  gpu_name: string | null;
  pid: number | null;
  engine_id: number | null;
}

/** one registered cluster; part of GET /dtwork/clusters */
export interface IClusterInfo {
  id: string;
  state: string | null;
  n: number | null;
  backend: string | null;
  profile: string | null;
  master: string | null;
  kernel_pid: number | null;
  kernel_host: string | null;
  kernel_alive: boolean;
  /** its kernel's notebook as the server's session names it now (it follows renames) */
  notebook: string | null;
  /** 'notebook', or 'script': started by a program outside any notebook (older servers: absent) */
  origin?: string;
  /** a script's file name (train.py), when its process runs on the server's host */
  program?: string | null;
  started_at: number | null;
  ranks: IRankInfo[];
  pids: number[];
  /** seconds a kept cluster outlives its kernel (null: not kept) */
  keep: number | null;
  /** seconds left for a notebook to attach, once its kernel is gone */
  keep_left: number | null;
}

/** matches GET /dtwork/clusters */
export interface IClustersReply {
  clusters: IClusterInfo[];
}

/** matches POST /dtwork/clusters/<id>/stop */
export interface IStopReply {
  stopped: string;
  killed: number[];
}

/** a [step, value] point of a loss curve */
export type SparkPoint = [number, number];

/** an adaptive run's batch trajectory; part of GET /dtwork/runs (adaptive_batch in data.py) */
export interface IAdaptiveBatch {
  /** [step, global batch] at the decisions that changed it, the first decision included;
   * at most 16, first and last kept */
  changes: [number, number][];
  /** how many changes there were in all */
  n_changes: number;
  /** the last decision's global batch and LR factor */
  global_batch: number | null;
  lr_factor: number | null;
}

/** one run as listed; part of GET /dtwork/runs */
export interface IRunSummary {
  /** run ids are per store: with its store's key they name one run */
  id: number;
  /** its store's key: '' the server's default store, else the folder holding .dtwork/ */
  store?: string;
  name: string | null;
  status: string | null;
  created_at: number | null;
  ended_at: number | null;
  world_size: number | null;
  backend: string | null;
  cluster_id: string | null;
  notebook: string | null;
  n_cells: number | null;
  last_step: number | null;
  global_batch_size: number | null;
  /** samples/s */
  throughput: number | null;
  /** E(n) = T(n) / (n T(1)), 0..1 */
  scaling_efficiency: number | null;
  /** gradient noise scale B_simple = tr(Σ)/|G|² */
  b_simple: number | null;
  loss: number | null;
  sparkline: SparkPoint[];
  /** "diverged at step k (loss nan)" after the run's first non-finite logged value, else null */
  diverged?: string | null;
  /** the loss's colour, as in the notebook's and the report's figures */
  sparkline_colour?: string;
  /** the adaptive batch's trajectory; null for a run that never adapted its batch */
  adaptive_batch?: IAdaptiveBatch | null;
}

/** a search grouping its trials' runs; part of GET /dtwork/runs (SearchGroup in wire.py) */
export interface ISearchGroup {
  id: number;
  /** its store's key, as its runs' */
  store?: string;
  label: string;
  searcher: string;
  status: string;
  metric: string | null;
  /** the best searcher.metric so far, null before any trial has one */
  best: number | null;
  trials: number;
  running: number;
  stopped: number;
  done: number;
  failed: number;
  /** its trials' runs in trial order, the running ones last */
  run_ids: number[];
}

/** matches GET /dtwork/runs */
export interface IRunsReply {
  store_exists: boolean;
  total: number;
  runs: IRunSummary[];
  /** the newest searches (a server without searches sends none) */
  searches?: ISearchGroup[];
  /** where else to look: a search for stores cut short, a store that cannot be read */
  notes?: string[];
}

/** matches GET /dtwork/runs/<id> */
export interface IRunReply {
  run: IRunSummary & {
    last_metrics: Record<string, number | null>;
    metric_names: string[];
    per_slot_batch_size: number | null;
    diverged: string | null; // "diverged at step k (loss nan)", or null
    segments: { seq: number; cell_seq: number | null; first_step: number; changed: string[] }[];
  };
}

/** matches GET /dtwork/runs/<id>/metrics?name=NAME: points are [step, value, time] */
export interface IMetricsReply {
  run_id: number;
  name: string;
  total: number;
  points: [number, number | null, number | null][];
}

/** matches POST /dtwork/runs/<id>/report: path is relative to the Jupyter root */
export interface IReportReply {
  run_id: number;
  path: string;
}

/** one GPU sample; part of GET /dtwork/gpus (fields NVML cannot give are null) */
export interface IGpuInfo {
  index: number;
  name: string | null;
  uuid: string | null;
  driver: string | null;
  utilization: number | null;
  memory_used_mb: number | null;
  memory_total_mb: number | null;
  temperature_c: number | null;
  power_w: number | null;
}

/** matches GET /dtwork/gpus */
export interface IGpusReply {
  available: boolean;
  reason: string | null;
  gpus: IGpuInfo[];
}

/** every error answer of /dtwork/... */
export interface IErrorReply {
  error: string;
}
