/**
 * The training cell's dashboard fits one screen in a real JupyterLab, the notebook keeps its top
 * in view, and the sidebar draws the loss in the figures' colour. With DTWORK_SCREENSHOTS naming a
 * folder (docs/img) it also saves the README's pictures of the dashboard, the sidebar and a report,
 * each cropped to its element.
 */
import { expect, test } from '@jupyterlab/galata';
import type { Locator, Page, Response } from '@playwright/test';
import * as path from 'path';
import { addCode } from './cells';

const PANEL = '#dtwork-panel';
const PANEL_TAB = '.jp-SideBar .lm-TabBar-tab[data-id="dtwork-panel"]';

/** Save an element's picture for the README when DTWORK_SCREENSHOTS names a folder. */
async function readmeShot(locator: Locator, name: string): Promise<void> {
  const dir = process.env.DTWORK_SCREENSHOTS;
  if (dir) {
    await locator.screenshot({ path: path.join(dir, name) });
  }
}

/** The training cell's output: its height, how far the notebook scrolled past its top, a live widget. */
function dashboard(page: Page, cell: number) {
  return page.evaluate(index => {
    const cells = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell');
    const output = cells[index]?.querySelector('.jp-OutputArea-output');
    const scroller =
      cells[index]?.closest('.jp-WindowedPanel-outer') ?? cells[index]?.closest('.jp-Notebook');
    const box = output?.getBoundingClientRect();
    return {
      height: box?.height ?? 0,
      scrolledPast: box && scroller ? scroller.getBoundingClientRect().top - box.top : 0,
      widget: !!output?.querySelector('.jupyter-widgets'),
      plot: !!cells[index]?.querySelector('.js-plotly-plot') // the output itself, once static
    };
  }, cell);
}

test.describe('dtwork dashboard on screen', () => {
  test('the dashboard fits one screen; the sidebar and a report', async ({ page }, testInfo) => {
    test.setTimeout(480_000);
    const screen = page.viewportSize()?.height ?? 768;
    await page.notebook.createNew(); // no name: no rename to race with
    await page.notebook.setCell(0, 'code', '%load_ext dtwork\n%dtrain start -n 2');
    await page.notebook.runCell(0, { inplace: true });
    await addCode(
      page,
      '%%dtrain\nimport math, time\nfor step, _ in ctx.steps(range(80), max_steps=80):\n' +
        '    time.sleep(0.15)\n    ctx.log(loss=2.5 * math.exp(-step / 15) + 0.1, accuracy=1 - math.exp(-step / 20))'
    );
    const running = page.notebook.runCell(1, { inplace: true });
    let live = { height: 0, scrolledPast: 0 };
    await expect
      .poll(
        async () => {
          const view = await dashboard(page, 1);
          if (view.widget && view.plot) {
            live = { height: Math.max(live.height, view.height), scrolledPast: view.scrolledPast };
          }
          return view.widget && view.plot;
        },
        { timeout: 120_000 }
      )
      .toBe(true);
    expect(live.height, 'the live dashboard is drawn').toBeGreaterThan(300);
    expect(live.height, 'the live dashboard fits one screen').toBeLessThanOrEqual(screen);
    expect(live.scrolledPast, 'the notebook keeps the dashboard top in view').toBeLessThanOrEqual(1);
    await running;
    await expect.poll(async () => (await dashboard(page, 1)).widget, { timeout: 60_000 }).toBe(false);
    // the finished cell's static figure, once plotly's renderer has drawn it
    await expect.poll(async () => (await dashboard(page, 1)).plot, { timeout: 60_000 }).toBe(true);
    const finished = await dashboard(page, 1);
    expect(finished.height, 'the finished figure fits one screen').toBeLessThanOrEqual(screen);
    const output = page
      .locator('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')
      .nth(1)
      .locator('.jp-OutputArea-output')
      .first();
    await readmeShot(output, 'dashboard.png');

    if (!(await page.locator(PANEL).isVisible())) {
      await page.locator(PANEL_TAB).click();
    }
    const run = page.locator(`${PANEL} .dtwork-Run`).first();
    // the loss in its colour in every figure (dtwork/palette.py); the built extension under test
    await expect(run.locator('polyline')).toHaveAttribute('style', 'stroke: #1f77b4', { timeout: 60_000 });
    await readmeShot(page.locator(PANEL), 'sidebar.png');
    // the report needs the run store only: stop the cluster while this notebook is current
    await page.notebook.addCell('code', '%dtrain stop');
    await page.notebook.runCell(2, { inplace: true });

    const reported = page.waitForResponse(
      (r: Response) => new URL(r.url()).pathname.endsWith('/report') && r.request().method() === 'POST'
    );
    await run.locator('.dtwork-ReportLink').click();
    expect((await reported).status()).toBe(200);
    const report = page.locator('.jp-NotebookPanel:not(.lm-mod-hidden)');
    await expect(report.locator('.jp-Cell').first()).toBeVisible({ timeout: 60_000 });
    await page.screenshot({ path: testInfo.outputPath('report.png') });
    await readmeShot(report, 'report.png');
  });
});
