/** Call an async function every `periodMs`, never twice at once; stoppable. */
export class Poller {
  private _running = false;
  private _timer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    private readonly _fn: () => Promise<void>,
    private readonly _periodMs: number
  ) {}

  get running(): boolean {
    return this._running;
  }

  start(): void {
    if (!this._running) {
      this._running = true;
      void this._tick();
    }
  }

  stop(): void {
    this._running = false;
    clearTimeout(this._timer);
    this._timer = undefined;
  }

  private async _tick(): Promise<void> {
    this._timer = undefined;
    try {
      await this._fn();
    } catch (error) {
      console.warn('dtwork: poll failed', error);
    }
    if (this._running && this._timer === undefined) {
      this._timer = setTimeout(() => void this._tick(), this._periodMs);
    }
  }
}
