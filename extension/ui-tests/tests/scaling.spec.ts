/**
 * Analysis outputs in a real JupyterLab: `%dtrain scaling` on a live 2-rank cluster draws its
 * figure as results arrive and ends showing both world sizes on the page (JupyterLab's plotly
 * renderer ignores updates to an output it has drawn), its headline clear of the subplot titles.
 * Named to run after dtwork.spec.ts (files run in name order, one worker): that spec's first test
 * reads the server's store empty, and this one leaves a run in it.
 */
import { expect, test } from '@jupyterlab/galata';
import type { Page } from '@playwright/test';

interface IPlotView {
  widget: boolean;
  traces: { name: string; x: number[] }[];
  overlaps: string[];
  titles: number;
  dtworkFile: string;
}

/** The last cell's plotly figure as drawn: its traces, and title parts that overlap subplot titles. */
function lastPlot(page: Page, cell: number): Promise<IPlotView> {
  return page.evaluate(index => {
    const cells = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell');
    const node = cells[index];
    const plot = node?.querySelector('.js-plotly-plot') as
      (HTMLElement & { data?: { name?: string; x?: ArrayLike<number> }[] }) | null;
    const boxes = (sel: string) =>
      Array.from(plot?.querySelectorAll(sel) ?? []).map(
        e => [e.textContent ?? '', e.getBoundingClientRect()] as const
      );
    const titles = boxes('text.gtitle, text.gtitle-subtitle');
    const notes = boxes('.annotation-text');
    const overlaps: string[] = [];
    for (const [t, a] of titles) {
      for (const [n, b] of notes) {
        if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) {
          overlaps.push(`${t} / ${n}`);
        }
      }
    }
    const text = node?.querySelector('.jp-OutputArea')?.textContent ?? '';
    return {
      widget: !!node?.querySelector('.jupyter-widgets'),
      traces: (plot?.data ?? []).map(t => ({ name: t.name ?? '', x: t.x ? Array.from(t.x) : [] })),
      overlaps,
      titles: titles.length,
      dtworkFile: /DTWORK_FILE (\S+)/.exec(text)?.[1] ?? ''
    };
  }, cell);
}

test.describe('dtwork analysis outputs', () => {
  test('the scaling figure ends with both world sizes on the page', async ({ page }, testInfo) => {
    await page.notebook.createNew(); // no name: no rename to race with
    await page.notebook.setCell(0, 'code', '%load_ext dtwork\n%dtrain start -n 2');
    await page.notebook.runCell(0, { inplace: true });
    // the kernel imports the dtwork under test (PYTHONPATH), not an installed copy
    await page.notebook.addCell('code', 'import dtwork; print("DTWORK_FILE", dtwork.__file__)');
    await page.notebook.runCell(1, { inplace: true });
    await expect
      .poll(async () => (await lastPlot(page, 1)).dtworkFile)
      .toContain(process.env.DTWORK_EXPECT_ROOT ?? '/dtwork/');

    await page.notebook.addCell(
      'code',
      '%%dtrain\nimport torch.nn as nn\nnet = lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))'
    );
    await page.notebook.runCell(2, { inplace: true });
    await page.notebook.addCell('code', '%dtrain scaling --slots 1,2 --steps 3 net()');
    const running = page.notebook.runCell(3, { inplace: true });
    // while it measures, the figure is a widget that shows world size 1 first
    await expect
      .poll(async () => (await lastPlot(page, 3)).traces.find(t => t.name === 'measured')?.x ?? [], {
        timeout: 180_000
      })
      .toEqual(expect.arrayContaining([1]));
    await running;
    await expect.poll(async () => (await lastPlot(page, 3)).widget, { timeout: 30_000 }).toBe(false);
    const done = await lastPlot(page, 3);
    expect(done.traces.find(t => t.name === 'measured')?.x).toEqual([1, 2]);
    expect(done.traces.find(t => t.name === 'efficiency')?.x).toEqual([1, 2]);
    expect(done.titles, 'a title and a subtitle').toBe(2);
    expect(done.overlaps, 'title and subtitle clear of the subplot titles').toEqual([]);
    await expect(page.locator('.jp-Notebook .jp-Cell').nth(3)).toContainText('2 ranks:');
    await page.screenshot({ path: testInfo.outputPath('scaling.png') });

    await page.notebook.addCell('code', '%dtrain stop');
    await page.notebook.runCell(4, { inplace: true });
  });
});
