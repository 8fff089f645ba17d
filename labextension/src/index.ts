import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { ILauncher } from '@jupyterlab/launcher';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { fetchTutorials, GpuModel } from './api';
import { addCommands, CommandIDs } from './commands';
import { KernelActions } from './kernels';
import { GpuSidebar } from './sidebar';
import { GpuStatusItem } from './statusbar';

const PLUGIN_ID = 'nvkit:plugin';
const CATEGORY = 'nvkit';
const LAUNCHER_CATEGORY = 'nvkit tutorials';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU status bar, NVIDIA GPUs sidebar, nvkit tutorials and notebook commands.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [
    IStatusBar,
    ILabShell,
    ILauncher,
    ICommandPalette,
    ISettingRegistry,
    ILayoutRestorer,
    IDefaultFileBrowser
  ],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null,
    launcher: ILauncher | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null,
    fileBrowser: IDefaultFileBrowser | null
  ) => {
    const serverSettings = app.serviceManager.serverSettings;
    const model = new GpuModel(serverSettings);

    const actions = new KernelActions(app, tracker, model);
    const sidebar = new GpuSidebar(model, app.commands, actions);
    addCommands({ app, tracker, model, sidebarId: sidebar.id, fileBrowser });
    app.shell.add(sidebar, 'left', { rank: 850 });
    restorer?.add(sidebar, sidebar.id);

    if (statusBar) {
      // the notebook in front (not the last one focused: a launcher in front shows the total)
      const currentKernel = (): string | null => {
        const w = labShell ? labShell.currentWidget : tracker.currentWidget;
        if (!w || !tracker.has(w)) {
          return null;
        }
        return (w as NotebookPanel).sessionContext.session?.kernel?.id ?? null;
      };
      const item = new GpuStatusItem(model, currentKernel, kernelId => {
        app.shell.activateById(sidebar.id);
        sidebar.reveal(kernelId);
      });
      statusBar.registerStatusItem('nvkit:gpu-memory', {
        item,
        align: 'left',
        rank: 100
      });
      labShell?.currentChanged.connect(() => item.render());
      tracker.currentChanged.connect(() => item.render());
    }

    if (palette) {
      for (const command of [
        CommandIDs.insertPanel,
        CommandIDs.restartWithSelection,
        CommandIDs.openMonitor,
        CommandIDs.openSidebar,
        CommandIDs.refresh
      ]) {
        palette.addItem({ command, category: CATEGORY });
      }
    }

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => {
            model.interval = settings.get('refreshRate').composite as number;
            model.historyLength = settings.get('historyLength').composite as number;
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason =>
          console.warn('nvkit: settings could not be loaded', reason)
        );
    }

    if (launcher) {
      fetchTutorials(serverSettings)
        .then(tutorials =>
          tutorials.forEach((t, rank) =>
            launcher.add({
              command: CommandIDs.openTutorial,
              args: { name: t.name, title: t.title },
              category: LAUNCHER_CATEGORY,
              rank
            })
          )
        )
        .catch(reason =>
          console.warn('nvkit: the tutorials could not be listed', reason)
        );
    }
  }
};

export default plugin;
