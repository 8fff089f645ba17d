import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';
import {
  closeIcon,
  LabIcon,
  notebookIcon,
  refreshIcon,
  stopIcon
} from '@jupyterlab/ui-components';

import {
  fmtBytes,
  gib,
  GpuModel,
  IGpu,
  IGpuKernel,
  IGpuProcess,
  kernelBytes
} from './api';
import { CommandIDs } from './commands';
import { gpuIcon } from './icons';
import { KernelActions, kernelLabel } from './kernels';

const SVG_NS = 'http://www.w3.org/2000/svg';

/**
 * The "NVIDIA GPUs" sidebar: per GPU a memory bar, a short history line, the Jupyter kernels
 * holding memory on it (notebook, memory, model, actions) and the other processes; buttons for the
 * notebook commands. Plain DOM: the GPU figures update in place on each poll, a GPU's kernel list
 * is rebuilt only when it changed (so a button is never replaced under the pointer).
 */
export class GpuSidebar extends Widget {
  constructor(model: GpuModel, commands: CommandRegistry, actions: KernelActions) {
    super();
    this.id = 'nvkit-gpus';
    this.addClass('nvkit-Sidebar');
    this.title.icon = gpuIcon;
    this.title.caption = 'NVIDIA GPUs';
    this._model = model;
    this._actions = actions;

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

  /** Scroll to a kernel's entry and make it stand out for a moment (the status bar's click). */
  reveal(kernelId: string | null): void {
    this._reveal = kernelId;
    this._showReveal();
  }

  private _showReveal(): void {
    if (!this._reveal || !this.isVisible) {
      return;
    }
    const entry = this._body.querySelector<HTMLElement>(
      `.nvkit-Kernel[data-kernel-id="${CSS.escape(this._reveal)}"]`
    );
    if (!entry) {
      return;
    }
    this._reveal = null;
    entry.scrollIntoView({ block: 'nearest' });
    entry.classList.add('nvkit-mod-revealed');
    window.setTimeout(() => entry.classList.remove('nvkit-mod-revealed'), 2500);
  }

  private _render(): void {
    if (!this.isVisible && this._body.childElementCount > 0) {
      this._stale = true;
      return;
    }
    this._stale = false;
    const status = this._model.status;
    if (!status || status.gpus.length === 0) {
      this._cards.clear();
      this._body.replaceChildren();
      if (!status) {
        this._message(
          this._model.error
            ? `Could not read the GPUs: ${this._model.error.message}`
            : 'Reading GPUs…'
        );
      } else {
        this._message(
          status.reason || 'No NVIDIA GPU or driver found on the server.',
          'nvkit-Sidebar-empty'
        );
      }
      return;
    }
    // drop messages and the cards of GPUs that are gone; keep the others in place
    const wanted = new Set(status.gpus.map(g => g.uuid));
    for (const [uuid, card] of this._cards) {
      if (!wanted.has(uuid)) {
        card.node.remove();
        this._cards.delete(uuid);
      }
    }
    for (const c of Array.from(this._body.children)) {
      if (!(c as HTMLElement).classList.contains('nvkit-Gpu')) {
        c.remove();
      }
    }
    status.gpus.forEach((gpu, i) => {
      let card = this._cards.get(gpu.uuid);
      if (!card) {
        card = new GpuCard(this._actions);
        this._cards.set(gpu.uuid, card);
      }
      card.update(gpu, this._model.history(gpu.index));
      if (this._body.children[i] !== card.node) {
        this._body.insertBefore(card.node, this._body.children[i] ?? null);
      }
    });
    if (status.attribution && !status.attribution.ok) {
      this._message(status.attribution.reason ?? '', 'nvkit-Sidebar-message');
    }
    this._showReveal();
  }

  protected onAfterShow(): void {
    if (this._stale) {
      this._render();
    }
    this._showReveal();
  }

  private _message(text: string, cls = 'nvkit-Sidebar-message'): void {
    const p = document.createElement('p');
    p.className = cls;
    p.textContent = text;
    this._body.appendChild(p);
  }

  private _model: GpuModel;
  private _actions: KernelActions;
  private _body: HTMLElement;
  private _cards = new Map<string, GpuCard>();
  private _stale = false;
  private _reveal: string | null = null;
}

/** One GPU: title, bar, figures and history update in place; kernels and processes are rebuilt
 * when they change. */
class GpuCard {
  readonly node = el('div', 'nvkit-Gpu');

  constructor(private _actions: KernelActions) {
    this.node.append(this._title, this._bar, this._mem, this._history, this._people);
    this._bar.appendChild(this._fill);
  }

  update(gpu: IGpu, history: number[]): void {
    this.node.dataset.index = String(gpu.index);
    this._title.textContent = `GPU ${gpu.index} · ${gpu.name}`;
    this._title.title = `${gpu.uuid}\nPCI ${gpu.pci_bus_id}${
      gpu.architecture ? `\n${gpu.architecture}` : ''
    }`;
    const frac = gpu.memory_total > 0 ? gpu.memory_used / gpu.memory_total : 0;
    this._fill.style.width = pct(frac);
    this._fill.classList.toggle('nvkit-mod-high', frac > 0.9);
    const util =
      gpu.utilization === null || gpu.utilization === undefined
        ? ''
        : ` · ${gpu.utilization}% busy`;
    this._mem.textContent = `${gib(gpu.memory_used)} / ${gib(gpu.memory_total)} GiB${util}`;
    this._history.replaceWith((this._history = sparkline(history)));

    const kernels = gpu.kernels ?? [];
    // servers without attribution send processes only
    const others = gpu.kernels ? gpu.other_processes ?? [] : gpu.processes ?? [];
    const sig = JSON.stringify([kernels, others, gpu.memory_total]);
    if (sig !== this._sig) {
      this._sig = sig;
      this._people.replaceChildren(...this._peopleNodes(gpu, kernels, others));
    }
  }

  private _peopleNodes(gpu: IGpu, kernels: IGpuKernel[], others: IGpuProcess[]): HTMLElement[] {
    const out: HTMLElement[] = [];
    if (kernels.length > 0) {
      out.push(heading('Kernels'));
      const list = el('ul', 'nvkit-Kernels');
      for (const k of kernels) {
        list.appendChild(this._kernel(gpu, k));
      }
      out.push(list);
    }
    if (others.length > 0 || kernels.length === 0) {
      out.push(heading(kernels.length > 0 ? 'Other processes' : 'Processes'));
      const list = el('ul', 'nvkit-Gpu-processes');
      if (others.length === 0) {
        const li = el('li', 'nvkit-Gpu-noProcess');
        li.textContent = 'no processes';
        list.appendChild(li);
      }
      for (const p of others) {
        const li = el('li', 'nvkit-Gpu-process');
        li.textContent = processText(p);
        if (!p.name) {
          li.title = "name not shown: another user's process, or one not visible to the server";
        }
        list.appendChild(li);
      }
      out.push(list);
    }
    return out;
  }

  private _kernel(gpu: IGpu, k: IGpuKernel): HTMLElement {
    const li = el('li', 'nvkit-Kernel');
    li.dataset.kernelId = k.id;

    const top = el('div', 'nvkit-Kernel-top');
    const name = el('span', 'nvkit-Kernel-name');
    name.textContent = kernelLabel(k);
    name.title = [
      k.notebook ?? 'no notebook (a kernel without a session)',
      `kernel ${k.id} (${k.name ?? '?'}, ${k.execution_state ?? '?'})`,
      k.matched_by === 'pid'
        ? `found by pid ${k.pids.join(', ')}`
        : 'found by the report file its nvkit writes'
    ].join('\n');
    const mem = el('span', 'nvkit-Kernel-memory');
    mem.textContent =
      k.memory !== null
        ? `${gib(k.memory)} GiB`
        : k.reserved !== null
          ? `≥ ${gib(k.reserved)} GiB`
          : 'memory ?';
    mem.title =
      k.memory !== null
        ? 'GPU memory of its processes (NVML)'
        : 'NVML shows none of its processes; this is what its PyTorch allocator holds';
    top.append(name, mem);
    li.appendChild(top);

    const bar = el('div', 'nvkit-Kernel-bar');
    const fill = el('div', 'nvkit-Kernel-barFill');
    fill.style.width = pct(gpu.memory_total > 0 ? kernelBytes(k) / gpu.memory_total : 0);
    bar.appendChild(fill);
    li.appendChild(bar);

    const facts: string[] = [];
    if (k.model?.loaded) {
      facts.push(`model ${k.model.id}${k.model.device ? ` on ${k.model.device}` : ''}`);
    }
    if (k.reserved !== null && k.memory !== null) {
      facts.push(
        `torch ${fmtBytes(k.allocated ?? 0)} allocated / ${fmtBytes(k.reserved)} reserved`
      );
    }
    if (facts.length > 0) {
      const detail = el('div', 'nvkit-Kernel-detail');
      detail.textContent = facts.join(' · ');
      li.appendChild(detail);
    }

    const actions = el('div', 'nvkit-Kernel-actions');
    const act = (
      label: string,
      icon: LabIcon | null,
      run: () => Promise<unknown>,
      enabled = true
    ) => {
      const b = document.createElement('button');
      b.className = 'jp-Button jp-mod-minimal nvkit-Kernel-action';
      b.setAttribute('aria-label', label);
      b.title = label;
      b.dataset.action = label;
      if (icon) {
        icon.element({ container: b, tag: 'span', elementSize: 'normal' });
      } else {
        b.textContent = label;
      }
      b.disabled = !enabled;
      b.addEventListener('click', () => {
        b.disabled = true;
        li.classList.add('nvkit-mod-busy');
        run()
          .catch(e => console.error(`nvkit: ${label} failed`, e))
          .finally(() => {
            b.disabled = false;
            li.classList.remove('nvkit-mod-busy');
          });
      });
      actions.appendChild(b);
    };
    act('Open notebook', notebookIcon, () => this._actions.open(k), !!k.notebook);
    act('Interrupt', stopIcon, () => this._actions.interrupt(k));
    act('Restart', refreshIcon, () => this._actions.restart(k));
    act('Shut down', closeIcon, () => this._actions.shutdown(k));
    if (k.nvkit && k.model?.loaded) {
      act('Unload model', null, () => this._actions.unload(k));
    }
    li.appendChild(actions);
    return li;
  }

  private _title = el('div', 'nvkit-Gpu-title');
  private _bar = el('div', 'nvkit-Gpu-bar');
  private _fill = el('div', 'nvkit-Gpu-barFill');
  private _mem = el('div', 'nvkit-Gpu-memory');
  private _history: SVGElement = sparkline([]);
  private _people = el('div', 'nvkit-Gpu-people');
  private _sig = '';
}

function heading(text: string): HTMLElement {
  const h = el('div', 'nvkit-Gpu-heading');
  h.textContent = text;
  return h;
}

function pct(frac: number): string {
  return `${Math.min(100, Math.max(0, frac * 100)).toFixed(1)}%`;
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
