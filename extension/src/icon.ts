import { LabIcon } from '@jupyterlab/ui-components';

/** Four ranks joined in a ring: the sidebar tab's icon (themed through jp-icon3). */
const SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <circle cx="6" cy="6" r="3"/><circle cx="18" cy="6" r="3"/>
    <circle cx="6" cy="18" r="3"/><circle cx="18" cy="18" r="3"/>
    <path d="M8.5 5h7v2h-7zM8.5 17h7v2h-7zM5 8.5h2v7H5zM17 8.5h2v7h-2z"/>
  </g>
</svg>`;

export const dtworkIcon = new LabIcon({ name: 'dtwork:panel', svgstr: SVG });
