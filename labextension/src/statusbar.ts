import { Widget } from '@lumino/widgets';

import { gib, GpuModel } from './api';

/** Status-bar text: memory used / total over all GPUs; the tooltip lists each GPU. */
export class GpuStatusItem extends Widget {
  constructor(model: GpuModel, onClick: () => void) {
    super();
    this.addClass('nvkit-StatusItem');
    this.node.setAttribute('data-nvkit', 'statusbar');
    this.node.addEventListener('click', onClick);
    this._model = model;
    model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
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
      text = `${n} GPU${n > 1 ? 's' : ''}: ${gib(used)} / ${gib(total)} GiB`;
      title = status.gpus
        .map(
          g =>
            `GPU ${g.index} ${g.name}: ${gib(g.memory_used)} / ${gib(g.memory_total)} GiB` +
            (g.utilization === null || g.utilization === undefined
              ? ''
              : `, ${g.utilization}% busy`)
        )
        .join('\n');
    }
    this.node.textContent = text;
    this.node.title = `${title}\n(click: NVIDIA GPUs panel)`;
  }

  private _model: GpuModel;
}
