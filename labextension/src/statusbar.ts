import { Widget } from '@lumino/widgets';

import { gib, GpuModel, kernelTotal } from './api';

/**
 * Status-bar text. With a notebook in front: its kernel's GPU memory beside the total over all
 * GPUs ("this notebook 3.0 GiB · GPUs 31.0/561.6 GiB"); otherwise used / total over all GPUs.
 * The tooltip lists each GPU; a click opens the sidebar on the notebook's entry.
 */
export class GpuStatusItem extends Widget {
  constructor(
    model: GpuModel,
    currentKernel: () => string | null,
    onClick: (kernelId: string | null) => void
  ) {
    super();
    this.addClass('nvkit-StatusItem');
    this.node.setAttribute('data-nvkit', 'statusbar');
    this.node.addEventListener('click', () => onClick(currentKernel()));
    this._model = model;
    this._currentKernel = currentKernel;
    model.changed.connect(this.render, this);
    this.render();
  }

  dispose(): void {
    this._model.changed.disconnect(this.render, this);
    super.dispose();
  }

  /** Redraw (the model's poll calls it; so does a change of the notebook in front). */
  render(): void {
    const status = this._model.status;
    let text: string;
    let title: string;
    if (!status) {
      text = this._model.error ? 'GPU: ?' : 'GPU …';
      title = this._model.error
        ? `nvkit could not read the GPUs: ${this._model.error.message}`
        : 'Reading GPUs…';
    } else if (status.gpus.length === 0) {
      text = 'No GPU';
      title = status.reason || 'No NVIDIA GPU or driver found on the server.';
    } else {
      const used = status.gpus.reduce((s, g) => s + g.memory_used, 0);
      const total = status.gpus.reduce((s, g) => s + g.memory_total, 0);
      const n = status.gpus.length;
      const kernel = this._currentKernel();
      if (kernel) {
        const mine = kernelTotal(status, kernel);
        text = `this notebook ${gib(mine)} GiB · GPUs ${gib(used)}/${gib(total)} GiB`;
      } else {
        text = `${n} GPU${n > 1 ? 's' : ''}: ${gib(used)} / ${gib(total)} GiB`;
      }
      title = status.gpus
        .map(g => {
          const here = kernel
            ? (g.kernels ?? []).filter(k => k.id === kernel).length > 0
            : false;
          return (
            `GPU ${g.index} ${g.name}: ${gib(g.memory_used)} / ${gib(g.memory_total)} GiB` +
            (g.utilization === null || g.utilization === undefined
              ? ''
              : `, ${g.utilization}% busy`) +
            (here ? ' (this notebook)' : '')
          );
        })
        .join('\n');
    }
    this.node.textContent = text;
    this.node.title = `${title}\n(click: NVIDIA GPUs panel)`;
  }

  private _model: GpuModel;
  private _currentKernel: () => string | null;
}
