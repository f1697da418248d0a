import { el } from './dom';

/** A titled part of the panel whose body is replaced only when its data changed. */
export class Section {
  readonly node: HTMLElement;
  private readonly _body: HTMLElement;
  private _key: string | null = null;

  constructor(name: string, title: string) {
    this._body = el('div', { className: 'dtwork-Section-body', text: 'Loading…' });
    this.node = el(
      'section',
      { className: 'dtwork-Section', data: { section: name } },
      el('h3', { className: 'dtwork-Section-title', text: title }),
      this._body
    );
  }

  /** Show `build()` unless `key` (a digest of the data) is the one already shown. */
  show(key: string, build: () => HTMLElement): void {
    if (key !== this._key) {
      this._key = key;
      this._body.replaceChildren(build());
    }
  }
}
