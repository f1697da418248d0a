/** A tiny DOM builder (no JupyterLab imports, so render code is unit-testable). */

type Child = Node | string | null | undefined | false;

export interface IProps {
  className?: string;
  title?: string;
  text?: string;
  data?: Record<string, string>;
  attrs?: Record<string, string>;
  onClick?: (event: MouseEvent) => void;
}

/** Create an HTML element with a class, attributes, a click handler and children. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: IProps = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (props.className) {
    node.className = props.className;
  }
  if (props.title) {
    node.title = props.title;
  }
  if (props.text !== undefined) {
    node.textContent = props.text;
  }
  for (const [key, value] of Object.entries(props.data ?? {})) {
    node.dataset[key] = value;
  }
  for (const [key, value] of Object.entries(props.attrs ?? {})) {
    node.setAttribute(key, value);
  }
  if (props.onClick) {
    (node as HTMLElement).addEventListener('click', props.onClick);
  }
  for (const child of children) {
    if (child) {
      node.append(child);
    }
  }
  return node;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** Create an SVG element with attributes. */
export function svg(tag: string, attrs: Record<string, string>, ...children: Element[]): SVGElement {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}
