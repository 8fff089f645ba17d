import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

/** One process on a GPU, as `GPU.to_dict()` reports it (fields vary with the driver). */
export interface IGpuProcess {
  pid: number;
  name?: string;
  used_memory?: number | null;
  [key: string]: unknown;
}

/** What a kernel that imported nvkit says it has loaded (its report file). */
export interface IKernelModel {
  id: string;
  loaded: boolean;
  device: string | null;
}

/**
 * A Jupyter kernel of this server holding memory on a GPU: matched by its pid (or a child's), or
 * by the report file a kernel running nvkit writes (containers, where NVML's pids match nothing).
 */
export interface IGpuKernel {
  id: string;
  name: string | null;
  execution_state: string | null;
  /** notebook (or console) path relative to the server root; null for a kernel without a session */
  notebook: string | null;
  session_type: string | null;
  pids: number[];
  /** bytes NVML counts for the kernel's processes; null when NVML shows none of them */
  memory: number | null;
  /** torch's allocator in that kernel, when it reports (CUDA initialised there) */
  reserved: number | null;
  allocated: number | null;
  model: IKernelModel | null;
  /** the kernel runs nvkit (it reports, and answers the "nvkit.unload" comm) */
  nvkit: boolean;
  matched_by: 'pid' | 'report';
}

/** `nvkit.GPU.to_dict()` plus the server's attribution: memory in bytes, utilization in percent. */
export interface IGpu {
  index: number;
  uuid: string;
  name: string;
  pci_bus_id: string;
  memory_total: number;
  memory_used: number;
  memory_free: number;
  utilization: number | null;
  capability?: [number, number] | string | null;
  architecture?: string | null;
  mig_mode?: boolean | string | null;
  processes?: IGpuProcess[];
  kernels?: IGpuKernel[];
  /** processes of no kernel of this server; names only for the server's user's own */
  other_processes?: IGpuProcess[];
}

/** `GET nvkit/api/gpus`: `reason` says why `gpus` is empty. */
export interface IGpuStatus {
  gpus: IGpu[];
  count: number;
  reason: string | null;
  attribution?: { ok: boolean; reason: string | null };
}

export interface ITutorial {
  name: string;
  title: string;
}

/** Thrown for non-2xx answers; keeps the parsed body (e.g. the 409 of a tutorial copy). */
export class ApiError extends Error {
  constructor(readonly status: number, readonly body: any) {
    super((body && body.message) || `HTTP ${status}`);
  }
}

/**
 * Call nvkit's server extension. The URL comes from the server settings, so the extension works
 * under any base URL; `makeRequest` adds the token / XSRF header the server wants.
 */
export async function requestAPI<T>(
  endPoint: string,
  settings: ServerConnection.ISettings,
  init: RequestInit = {}
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'nvkit', 'api', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: any = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // not JSON: keep the text
    }
  }
  if (!response.ok) {
    throw new ApiError(response.status, data);
  }
  return data as T;
}

export const fetchTutorials = async (
  settings: ServerConnection.ISettings
): Promise<ITutorial[]> =>
  (await requestAPI<{ tutorials: ITutorial[] }>('tutorials', settings))
    .tutorials;

/** POST tutorials/<name>: copy a tutorial into `dir`; 409 (ApiError) when it exists already. */
export const copyTutorial = (
  settings: ServerConnection.ISettings,
  name: string,
  dir: string,
  overwrite = false
): Promise<{ path: string; name: string; overwritten: boolean }> =>
  requestAPI(
    `tutorials/${encodeURIComponent(name)}${overwrite ? '?overwrite=true' : ''}`,
    settings,
    { method: 'POST', body: JSON.stringify({ dir }) }
  );

/**
 * The GPU state shared by the status bar and the sidebar: one poll, with backoff on errors and
 * standby while the page is hidden, plus a short memory history per GPU.
 */
export class GpuModel {
  constructor(settings: ServerConnection.ISettings, interval = 2000) {
    this._settings = settings;
    this._poll = new Poll<IGpuStatus | null, Error, 'standby'>({
      auto: true,
      factory: () => this._tick(),
      frequency: GpuModel.frequency(interval),
      name: 'nvkit:gpus',
      standby: 'when-hidden'
    });
  }

  static frequency(interval: number) {
    return { interval, backoff: true, max: Math.max(interval * 10, 30000) };
  }

  /** The last answer (null before the first one). */
  get status(): IGpuStatus | null {
    return this._status;
  }

  /** The last error (null after a good answer). */
  get error(): Error | null {
    return this._error;
  }

  /** Memory use per GPU index, as fractions 0..1, oldest first. */
  history(index: number): number[] {
    return this._history.get(index) ?? [];
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  set interval(ms: number) {
    this._poll.frequency = GpuModel.frequency(ms);
  }

  set historyLength(n: number) {
    this._historyLength = Math.max(2, n);
  }

  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _tick(): Promise<IGpuStatus | null> {
    try {
      const status = await requestAPI<IGpuStatus>('gpus', this._settings);
      this._status = status;
      this._error = null;
      for (const gpu of status.gpus) {
        const h = this._history.get(gpu.index) ?? [];
        h.push(gpu.memory_total > 0 ? gpu.memory_used / gpu.memory_total : 0);
        while (h.length > this._historyLength) {
          h.shift();
        }
        this._history.set(gpu.index, h);
      }
      this._changed.emit();
      return status;
    } catch (e) {
      this._error = e as Error;
      this._changed.emit();
      throw e; // a rejected tick makes the poll back off
    }
  }

  private _settings: ServerConnection.ISettings;
  private _poll: Poll<IGpuStatus | null, Error, 'standby'>;
  private _status: IGpuStatus | null = null;
  private _error: Error | null = null;
  private _history = new Map<number, number[]>();
  private _historyLength = 60;
  private _changed = new Signal<this, void>(this);
}

/** Bytes a kernel holds on one GPU as shown: NVML's figure, else the allocator's reserve. */
export function kernelBytes(k: IGpuKernel): number {
  return k.memory ?? k.reserved ?? 0;
}

/** Bytes kernel `id` holds over all GPUs (0 when it holds none or is unknown). */
export function kernelTotal(status: IGpuStatus | null, id: string | null): number {
  if (!status || !id) {
    return 0;
  }
  let sum = 0;
  for (const g of status.gpus) {
    for (const k of g.kernels ?? []) {
      if (k.id === id) {
        sum += kernelBytes(k);
      }
    }
  }
  return sum;
}

/** `3.2 GiB`, `512 MiB`, `12 KiB`: for one kernel's share and bytes freed. */
export function fmtBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = bytes;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i < 2 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

const GiB = 1024 ** 3;

/** `140.4` style GiB (one decimal below 1000 GiB). */
export function gib(bytes: number): string {
  const v = bytes / GiB;
  return v >= 1000 ? v.toFixed(0) : v.toFixed(1);
}
