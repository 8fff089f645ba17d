import { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { FileBrowser } from '@jupyterlab/filebrowser';
import {
  INotebookTracker,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';
import { lineFormIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { ApiError, copyTutorial, GpuModel } from './api';
import { gpuIcon } from './icons';

export namespace CommandIDs {
  export const insertPanel = 'nvkit:insert-panel';
  export const restartWithSelection = 'nvkit:restart-with-selection';
  export const openMonitor = 'nvkit:open-memory-monitor';
  export const openSidebar = 'nvkit:open-gpus';
  export const refresh = 'nvkit:refresh-gpus';
  export const openTutorial = 'nvkit:open-tutorial';
}

export const PANEL_CODE = 'import nvkit\nnvkit.panel()';
export const MONITOR_CODE = 'import nvkit\nnvkit.monitor()';
// Runs silently right after the restart: importing nvkit applies the GPU selection saved before
// the restart (nvkit.selection), before anything can create a CUDA context.
const APPLY_SELECTION_CODE = 'import nvkit';
const VISIBLE_EXPR = "__import__('os').environ.get('CUDA_VISIBLE_DEVICES')";

export interface ICommandDeps {
  app: JupyterFrontEnd;
  tracker: INotebookTracker;
  model: GpuModel;
  sidebarId: string;
  fileBrowser: FileBrowser | null;
}

/** The current notebook, or a new one when none is open. */
async function notebookPanel(deps: ICommandDeps): Promise<NotebookPanel> {
  let panel = deps.tracker.currentWidget;
  if (!panel) {
    panel = (await deps.app.commands.execute('notebook:create-new', {
      cwd: deps.fileBrowser?.model.path ?? '',
      kernelName:
        deps.app.serviceManager.kernelspecs.specs?.default ?? 'python3'
    })) as NotebookPanel;
  }
  await panel.context.ready;
  await panel.sessionContext.ready;
  deps.app.shell.activateById(panel.id);
  return panel;
}

/** Put `source` in a new code cell below the active one (or in the active cell if it is an
 * empty code cell) and run it. */
async function insertAndRun(deps: ICommandDeps, source: string): Promise<void> {
  const panel = await notebookPanel(deps);
  const nb = panel.content;
  const active = nb.activeCell;
  const reuse =
    active &&
    active.model.type === 'code' &&
    active.model.sharedModel.getSource().trim() === '';
  if (!reuse) {
    NotebookActions.insertBelow(nb);
  }
  if (nb.activeCell?.model.type !== 'code') {
    NotebookActions.changeCellType(nb, 'code');
  }
  nb.activeCell!.model.sharedModel.setSource(source);
  await NotebookActions.run(nb, panel.sessionContext);
}

async function restartWithSelection(deps: ICommandDeps): Promise<void> {
  const panel = deps.tracker.currentWidget;
  if (!panel) {
    Notification.warning('Open a notebook first: its kernel is the one restarted.');
    return;
  }
  const answer = await showDialog({
    title: 'Restart kernel with GPU selection?',
    body:
      'The kernel restarts (its variables are lost) and nvkit applies the GPU selection you ' +
      'saved, before any CUDA work.',
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Restart' })]
  });
  if (!answer.button.accept) {
    return;
  }
  const ctx = panel.sessionContext;
  await ctx.restartKernel();
  const kernel = ctx.session?.kernel;
  if (!kernel) {
    Notification.error('The kernel did not come back after the restart.');
    return;
  }
  const reply = await kernel.requestExecute({
    code: APPLY_SELECTION_CODE,
    silent: true,
    store_history: false,
    user_expressions: { visible: VISIBLE_EXPR }
  }).done;
  const content = reply.content as any;
  if (content.status !== 'ok') {
    Notification.error(
      `Kernel restarted, but "import nvkit" failed: ${content.ename}: ${content.evalue}`
    );
    return;
  }
  const raw = content.user_expressions?.visible?.data?.['text/plain'] as
    | string
    | undefined;
  const visible = raw && raw !== 'None' ? raw.replace(/^'|'$/g, '') : null;
  Notification.success(
    visible === null
      ? 'Kernel restarted: no GPU selection saved, all GPUs are visible.'
      : `Kernel restarted with the saved GPU selection: CUDA_VISIBLE_DEVICES=${visible}`,
    { autoClose: 6000 }
  );
  void deps.model.refresh();
}

/** A failed copy: a dialog that says why (a notification alone is easy to miss while the
 * notebook the user asked for does not open). The server removed what the copy had made. */
async function copyFailed(name: string, dir: string, e: unknown): Promise<void> {
  const reason = e instanceof Error ? e.message : String(e);
  const where = dir ? `the folder ${dir}` : 'the top folder';
  const body = document.createElement('div');
  body.className = 'nvkit-CopyFailed';
  for (const text of [
    `${name} could not be copied into ${where}:`,
    reason,
    'Nothing of the copy was kept. Fix the cause, or open another folder in the file ' +
      'browser, and click the tutorial again.'
  ]) {
    const p = body.appendChild(document.createElement('p'));
    p.textContent = text;
    p.style.margin = '0 0 8px'; // inline: the rule belongs to this one dialog
  }
  await showDialog({
    title: 'Could not copy the tutorial',
    body: new Widget({ node: body }),
    buttons: [Dialog.okButton({ label: 'Close' })]
  });
}

async function openTutorial(deps: ICommandDeps, name: string): Promise<void> {
  const settings = deps.app.serviceManager.serverSettings;
  const dir = deps.fileBrowser?.model.path ?? '';
  let path: string;
  try {
    path = (await copyTutorial(settings, name, dir)).path;
  } catch (e) {
    // a 409 with `exists` is the user's earlier copy; any other 409 (a folder of that name) is an error
    if (!(e instanceof ApiError && e.status === 409 && e.body?.exists)) {
      await copyFailed(name, dir, e);
      return;
    }
    path = e.body.path as string;
    // a copy still as shipped holds nothing of the user's: open it without a question
    if (!e.body.unchanged) {
      const answer = await showDialog({
        title: 'Tutorial already copied',
        body: `${path} exists. Open your copy, or replace it with a fresh one (your changes are lost)?`,
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({ label: 'Replace', displayType: 'warn' }),
          Dialog.okButton({ label: 'Open my copy' })
        ]
      });
      if (!answer.button.accept) {
        return;
      }
      if (answer.button.label === 'Replace') {
        try {
          path = (await copyTutorial(settings, name, dir, true)).path;
        } catch (e2) {
          await copyFailed(name, dir, e2);
          return;
        }
      }
    }
  }
  await deps.app.commands.execute('docmanager:open', { path });
}

export function addCommands(deps: ICommandDeps): void {
  const { app, tracker, model } = deps;
  const { commands } = app;

  commands.addCommand(CommandIDs.insertPanel, {
    label: args => (args.toolbar ? '' : 'Insert nvkit panel'),
    caption: 'Add a cell with nvkit.panel() and run it',
    icon: gpuIcon,
    execute: () => insertAndRun(deps, PANEL_CODE)
  });

  commands.addCommand(CommandIDs.openMonitor, {
    label: args => (args.toolbar ? '' : 'Open memory monitor'),
    caption: 'Add a cell with nvkit.monitor() (live GPU memory chart) and run it',
    icon: lineFormIcon,
    execute: () => insertAndRun(deps, MONITOR_CODE)
  });

  commands.addCommand(CommandIDs.restartWithSelection, {
    // in the toolbar as text: the built-in restart button already uses the refresh icon
    label: args =>
      args.toolbar ? 'Restart with GPUs' : 'Restart kernel with GPU selection',
    caption: 'Restart the kernel so the GPU selection saved by nvkit applies',
    isEnabled: () => tracker.currentWidget !== null,
    execute: () => restartWithSelection(deps)
  });

  commands.addCommand(CommandIDs.openSidebar, {
    label: 'Show NVIDIA GPUs',
    caption: 'Open the NVIDIA GPUs sidebar',
    execute: () => app.shell.activateById(deps.sidebarId)
  });

  commands.addCommand(CommandIDs.refresh, {
    label: 'Refresh GPU status',
    execute: () => model.refresh()
  });

  commands.addCommand(CommandIDs.openTutorial, {
    label: args => (args.title as string) || (args.name as string) || 'nvkit tutorial',
    caption: args =>
      `Copy ${args.name ?? 'the tutorial'} into the current folder and open it`,
    icon: gpuIcon,
    execute: args => openTutorial(deps, args.name as string)
  });
}
