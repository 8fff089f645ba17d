import { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';

import { fmtBytes, GpuModel, IGpuKernel } from './api';

/** The comm target a kernel registers when it imports nvkit (nvkit/kernel_report.py). */
export const UNLOAD_TARGET = 'nvkit.unload';
const UNLOAD_TIMEOUT_MS = 180_000;

/** What `nvkit.unload` answers. */
export interface IUnloadReply {
  ok: boolean;
  freed: number;
  model: string | null;
  message: string;
}

/** A kernel's label in the sidebar and dialogs: its notebook's file name, else its id. */
export function kernelLabel(k: IGpuKernel): string {
  if (k.notebook) {
    const parts = k.notebook.split('/');
    return parts[parts.length - 1] || k.notebook;
  }
  return `kernel ${k.id.slice(0, 8)}`;
}

/**
 * The sidebar's kernel actions, each through JupyterLab's own services: the document manager
 * opens, the kernel and session managers interrupt, restart and shut down, and a comm carries
 * "unload model" to the kernel.
 */
export class KernelActions {
  constructor(
    private _app: JupyterFrontEnd,
    private _tracker: INotebookTracker,
    private _model: GpuModel
  ) {}

  async open(k: IGpuKernel): Promise<void> {
    if (k.notebook) {
      await this._app.commands.execute('docmanager:open', { path: k.notebook });
    }
  }

  async interrupt(k: IGpuKernel): Promise<void> {
    await this._withKernel(k, kernel => kernel.interrupt());
    Notification.info(`Interrupt sent to ${kernelLabel(k)}.`, { autoClose: 3000 });
  }

  async restart(k: IGpuKernel): Promise<void> {
    const ok = await this._confirm(
      `Restart the kernel of ${kernelLabel(k)}?`,
      'Its variables are lost and the GPU memory it holds is given back.',
      'Restart'
    );
    if (!ok) {
      return;
    }
    await this._withKernel(k, kernel => kernel.restart());
    Notification.success(`${kernelLabel(k)}: kernel restarted.`, { autoClose: 4000 });
    void this._model.refresh();
  }

  async shutdown(k: IGpuKernel): Promise<void> {
    const ok = await this._confirm(
      `Shut down the kernel of ${kernelLabel(k)}?`,
      'The kernel ends: its variables are lost and the GPU memory it holds is given back. ' +
        'The notebook itself stays as it is.',
      'Shut down'
    );
    if (!ok) {
      return;
    }
    const { sessions, kernels } = this._app.serviceManager;
    // The session's own shutdown, so an open notebook shows "No Kernel" rather than a dead one.
    await sessions.refreshRunning();
    const session = Array.from(sessions.running()).find(s => s.kernel?.id === k.id);
    if (session) {
      await sessions.shutdown(session.id);
    } else {
      await kernels.shutdown(k.id);
    }
    Notification.success(`${kernelLabel(k)}: kernel shut down.`, { autoClose: 4000 });
    void this._model.refresh();
  }

  /** Ask the kernel to unload its nvkit model; shows and returns its answer. */
  async unload(k: IGpuKernel): Promise<IUnloadReply | null> {
    let reply: IUnloadReply;
    try {
      reply = await this._withKernel(k, kernel => askUnload(kernel));
    } catch (e) {
      Notification.error(`${kernelLabel(k)}: ${(e as Error).message}`);
      return null;
    }
    if (reply.ok) {
      Notification.success(
        `${kernelLabel(k)}: ${reply.model} unloaded, ${fmtBytes(reply.freed)} freed.`,
        { autoClose: 6000 }
      );
    } else {
      Notification.warning(`${kernelLabel(k)}: ${reply.message}`, { autoClose: 6000 });
    }
    void this._model.refresh();
    return reply;
  }

  private async _confirm(title: string, body: string, label: string): Promise<boolean> {
    const answer = await showDialog({
      title,
      body,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label })]
    });
    return answer.button.accept;
  }

  /**
   * Run `fn` on a connection to the kernel: an open notebook's own connection when there is one
   * (it handles the kernel's comms, and its toolbar follows a restart), else a connection made for
   * this call and closed after it (which leaves the kernel running).
   */
  private async _withKernel<T>(
    k: IGpuKernel,
    fn: (kernel: Kernel.IKernelConnection) => Promise<T>
  ): Promise<T> {
    const panel = this._tracker.find(
      p => p.sessionContext.session?.kernel?.id === k.id
    );
    const own = panel?.sessionContext.session?.kernel;
    if (own) {
      return fn(own);
    }
    const kernel = this._app.serviceManager.kernels.connectTo({
      model: { id: k.id, name: k.name ?? '' }
    });
    try {
      return await fn(kernel);
    } finally {
      kernel.dispose();
    }
  }
}

/** Open a comm to the kernel's `nvkit.unload` target and wait for its one answer. */
function askUnload(kernel: Kernel.IKernelConnection): Promise<IUnloadReply> {
  return new Promise<IUnloadReply>((resolve, reject) => {
    let answered = false;
    const comm = kernel.createComm(UNLOAD_TARGET);
    const timer = window.setTimeout(() => {
      reject(new Error('the kernel did not answer (is it busy running a cell?)'));
    }, UNLOAD_TIMEOUT_MS);
    comm.onMsg = msg => {
      answered = true;
      window.clearTimeout(timer);
      resolve(msg.content.data as unknown as IUnloadReply);
    };
    comm.onClose = () => {
      window.clearTimeout(timer);
      if (!answered) {
        // ipykernel closes a comm to a target nobody registered
        reject(
          new Error(
            'this kernel has no nvkit unload target: run "import nvkit" in it first'
          )
        );
      }
    };
    comm.open({});
  });
}
