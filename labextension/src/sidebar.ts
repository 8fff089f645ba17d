import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

import { gib, GpuModel, IGpu, IGpuProcess } from './api';
import { CommandIDs } from './commands';
import { gpuIcon } from './icons';

const SVG_NS = 'http://www.w3.org/2000/svg';

/**
 * The "NVIDIA GPUs" sidebar: per GPU a memory bar, a short history line and its processes; buttons
 * for the notebook commands. Plain DOM, redrawn on each poll (a handful of GPUs).
 */
export class GpuSidebar extends Widget {
  constructor(model: GpuModel, commands: CommandRegistry) {
    super();
    this.id = 'nvkit-gpus';
    this.addClass('nvkit-Sidebar');
    this.title.icon = gpuIcon;
    this.title.caption = 'NVIDIA GPUs';
    this._model = model;

    const header = document.createElement('div');
    header.className = 'nvkit-Sidebar-header';
    const h = document.createElement('h2');
    h.textContent = 'NVIDIA GPUs';
    header.appendChild(h);
    const buttons = document.createElement('div');
    buttons.className = 'nvkit-Sidebar-buttons';
    for (const [id, label] of [
      [CommandIDs.insertPanel, 'Insert panel'],
      [CommandIDs.openMonitor, 'Memory monitor'],
      [CommandIDs.restartWithSelection, 'Restart with selection'],
      [CommandIDs.refresh, 'Refresh']
    ]) {
      const b = document.createElement('button');
      b.className = 'jp-mod-styled jp-mod-accept nvkit-Sidebar-button';
      b.textContent = label;
      b.dataset.command = id;
      b.title = commands.caption(id) || commands.label(id);
      b.addEventListener('click', () => void commands.execute(id));
      buttons.appendChild(b);
    }
    header.appendChild(buttons);
    this.node.appendChild(header);

    this._body = document.createElement('div');
    this._body.className = 'nvkit-Sidebar-body';
    this.node.appendChild(this._body);

    model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    if (!this.isVisible && this._body.childElementCount > 0) {
      this._stale = true;
      return;
    }
    this._stale = false;
    const status = this._model.status;
    this._body.replaceChildren();
    if (!status) {
      this._message(
        this._model.error
          ? `Could not read the GPUs: ${this._model.error.message}`
          : 'Reading GPUs…'
      );
      return;
    }
    if (status.gpus.length === 0) {
      this._message(
        status.reason || 'No NVIDIA GPU or driver found on the server.',
        'nvkit-Sidebar-empty'
      );
      return;
    }
    for (const gpu of status.gpus) {
      this._body.appendChild(this._card(gpu));
    }
  }

  protected onAfterShow(): void {
    if (this._stale) {
      this._render();
    }
  }

  private _message(text: string, cls = 'nvkit-Sidebar-message'): void {
    const p = document.createElement('p');
    p.className = cls;
    p.textContent = text;
    this._body.appendChild(p);
  }

  private _card(gpu: IGpu): HTMLElement {
    const card = el('div', 'nvkit-Gpu');
    card.dataset.index = String(gpu.index);
    const title = el('div', 'nvkit-Gpu-title');
    title.textContent = `GPU ${gpu.index} · ${gpu.name}`;
    title.title = `${gpu.uuid}\nPCI ${gpu.pci_bus_id}${
      gpu.architecture ? `\n${gpu.architecture}` : ''
    }`;
    card.appendChild(title);

    const frac = gpu.memory_total > 0 ? gpu.memory_used / gpu.memory_total : 0;
    const bar = el('div', 'nvkit-Gpu-bar');
    const fill = el('div', 'nvkit-Gpu-barFill');
    fill.style.width = `${Math.min(100, Math.max(0, frac * 100)).toFixed(1)}%`;
    if (frac > 0.9) {
      fill.classList.add('nvkit-mod-high');
    }
    bar.appendChild(fill);
    card.appendChild(bar);

    const mem = el('div', 'nvkit-Gpu-memory');
    const util =
      gpu.utilization === null || gpu.utilization === undefined
        ? ''
        : ` · ${gpu.utilization}% busy`;
    mem.textContent = `${gib(gpu.memory_used)} / ${gib(gpu.memory_total)} GiB${util}`;
    card.appendChild(mem);

    card.appendChild(sparkline(this._model.history(gpu.index)));

    const procs = gpu.processes ?? [];
    const list = el('ul', 'nvkit-Gpu-processes');
    if (procs.length === 0) {
      const li = el('li', 'nvkit-Gpu-noProcess');
      li.textContent = 'no processes';
      list.appendChild(li);
    }
    for (const p of procs) {
      const li = el('li', 'nvkit-Gpu-process');
      li.textContent = processText(p);
      list.appendChild(li);
    }
    card.appendChild(list);
    return card;
  }

  private _model: GpuModel;
  private _body: HTMLElement;
  private _stale = false;
}

function el(tag: string, cls: string): HTMLElement {
  const e = document.createElement(tag);
  e.className = cls;
  return e;
}

function processText(p: IGpuProcess): string {
  const mem =
    (p.used_memory as number | undefined) ??
    (p['memory_used'] as number | undefined) ??
    (p['used_gpu_memory'] as number | undefined);
  const name = (p.name ?? p['command'] ?? '') as string;
  return `${p.pid} ${name}`.trim() + (typeof mem === 'number' ? ` · ${gib(mem)} GiB` : '');
}

/** A 0..1 history as a small SVG line. */
function sparkline(values: number[]): SVGElement {
  const w = 200;
  const h = 28;
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('class', 'nvkit-Gpu-history');
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  const line = document.createElementNS(SVG_NS, 'polyline');
  const n = Math.max(values.length - 1, 1);
  line.setAttribute(
    'points',
    values
      .map((v, i) => `${((i / n) * w).toFixed(1)},${(h - 1 - v * (h - 2)).toFixed(1)}`)
      .join(' ')
  );
  svg.appendChild(line);
  return svg;
}
