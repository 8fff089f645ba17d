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

/** `nvkit.GPU.to_dict()`: memory in bytes, utilization in percent. */
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
}

/** `GET nvkit/api/gpus`: `reason` says why `gpus` is empty. */
export interface IGpuStatus {
  gpus: IGpu[];
  count: number;
  reason: string | null;
}

export interface ITutorial {
  name: string;
  title: string;
  path: string;
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

const GiB = 1024 ** 3;

/** `140.4` style GiB (one decimal below 1000 GiB). */
export function gib(bytes: number): string {
  const v = bytes / GiB;
  return v >= 1000 ? v.toFixed(0) : v.toFixed(1);
}
