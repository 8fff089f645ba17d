import { LabIcon } from '@jupyterlab/ui-components';

// A small chip outline; fills with the theme's icon colour.
const gpuSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 4h2V2h2v2h2V2h2v2h2a3 3 0 0 1 3 3v2h2v2h-2v2h2v2h-2v2a3 3 0 0 1-3 3h-2v2h-2v-2h-2v2H9v-2H7a3 3 0 0 1-3-3v-2H2v-2h2v-2H2V9h2V7a3 3 0 0 1 3-3zm0 2a1 1 0 0 0-1 1v10a1 1 0 0 0 1 1h10a1 1 0 0 0 1-1V7a1 1 0 0 0-1-1H7zm2 3h6v6H9V9z"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({ name: 'nvkit:gpu', svgstr: gpuSvg });
