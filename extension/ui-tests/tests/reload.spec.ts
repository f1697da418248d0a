/**
 * A notebook reloaded while a training cell runs shows the cell's live view again, updating as the
 * ranks train, and the finished figure once the cell ends (never "Loading widget..."). The ranks
 * pause at two steps until the test has seen what it waits for (a flag file each), so a slow machine
 * changes how long it takes, not what is seen.
 */
import { expect, type IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import * as fs from 'fs';
import { addCode } from './cells';

const NOTEBOOK = 'reload.ipynb';
const STEPS = 60;
const PAUSES = [20, 40];

/** The last cell's output as this page shows it. */
function cellView(page: IJupyterLabPageFixture) {
  return page.evaluate(() => {
    const cells = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell');
    const cell = cells[cells.length - 1];
    const view = cell?.querySelector('.dtwork-CellView') as HTMLElement | null;
    const plot = cell?.querySelector('.js-plotly-plot') as
      (HTMLElement & { data?: { name?: string; y?: ArrayLike<number> }[] }) | null;
    const loss = plot?.data?.find(t => t.name === 'loss');
    return {
      text: (cell?.querySelector('.jp-OutputArea') as HTMLElement | null)?.innerText ?? '',
      widget: !!cell?.querySelector('.jupyter-widgets .js-plotly-plot'), // the live widget's figure
      fromStore: !!view?.classList.contains('dtwork-mod-fromStore'),
      status: view?.dataset.status ?? null,
      step: view?.dataset.step ? Number(view.dataset.step) : null,
      points: loss?.y ? Array.from(loss.y) : null
    };
  });
}

/** galata's page reload (JupyterLabPage.reload), whose option its fixture's type does not name. */
interface IReloadable {
  reload(options: { waitForIsReady: boolean }): Promise<unknown>;
}

/** Reload the page and wait for the layout to bring the notebook back (opening it through the file
 * browser would wait for an idle kernel). */
async function reopen(page: IJupyterLabPageFixture): Promise<void> {
  // not galata's readiness check: it waits for a Launcher tab, and the restored layout has none
  await (page as unknown as IReloadable).reload({ waitForIsReady: false });
  await expect.poll(() => page.notebook.isOpen(NOTEBOOK), { timeout: 120_000 }).toBe(true);
  await expect(page.locator('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')).not.toHaveCount(
    0
  );
}

test('a notebook reloaded mid-training shows the live view again, then the finished figure', async ({
  page
}, testInfo) => {
  test.setTimeout(600_000); // a cluster's start, two reloads and a training cell on a loaded machine
  const flags = fs.mkdtempSync('/tmp/dtwork-reload-');
  await page.notebook.createNew(NOTEBOOK);
  await page.notebook.setCell(0, 'code', '%load_ext dtwork\n%dtrain start -n 2');
  await page.notebook.runCell(0, { inplace: true });
  await addCode(
    page,
    `%%dtrain\nimport os, time\nflag = lambda s: os.path.exists(f"${flags}/{s}")\n` +
      `for step, _ in ctx.steps(range(${STEPS}), max_steps=${STEPS}):\n` +
      '    until = time.time() + 240\n' +
      `    while step in (${PAUSES.join(', ')}) and not flag(step) and time.time() < until: time.sleep(0.05)\n` +
      '    time.sleep(0.05)\n    ctx.log(loss=float(step + 1))'
  );
  // the page that runs the cell draws the widget; the page reloaded below loses its promise
  page.notebook.runCell(1, { inplace: true }).catch(() => undefined);
  await expect.poll(async () => (await cellView(page)).widget, { timeout: 120_000 }).toBe(true);
  expect((await cellView(page)).fromStore).toBe(false);
  await page.notebook.save();

  await reopen(page);
  // back while the ranks wait at the first pause: the figure read from the run store
  await expect.poll(async () => (await cellView(page)).status, { timeout: 60_000 }).toBe('running');
  await expect
    .poll(async () => (await cellView(page)).points?.length ?? 0, { timeout: 60_000 })
    .toBeGreaterThan(0);
  const before = await cellView(page);
  expect(before.fromStore).toBe(true);
  expect(before.text).not.toContain('Loading widget');
  expect(before.step).not.toBeNull();
  expect(before.step!).toBeLessThanOrEqual(PAUSES[0]);
  await page.screenshot({ path: testInfo.outputPath('reload-live.png') });

  // it keeps updating as the ranks go on to the second pause
  fs.writeFileSync(`${flags}/${PAUSES[0]}`, '');
  await expect
    .poll(async () => (await cellView(page)).step ?? 0, { timeout: 120_000 })
    .toBeGreaterThan(PAUSES[0]);
  await expect
    .poll(async () => (await cellView(page)).points?.length ?? 0, { timeout: 60_000 })
    .toBeGreaterThan(before.points!.length);
  expect((await cellView(page)).status).toBe('running');

  // when the cell ends: the finished figure, every step, and no widget left waiting for its model
  fs.writeFileSync(`${flags}/${PAUSES[1]}`, '');
  await expect.poll(async () => (await cellView(page)).status, { timeout: 120_000 }).toBe('ok');
  const ones = Array.from({ length: STEPS }, (_, i) => i + 1);
  await expect.poll(async () => (await cellView(page)).points, { timeout: 30_000 }).toEqual(ones);
  expect((await cellView(page)).text).not.toMatch(/Loading widget|Error displaying widget/);
  await page.screenshot({ path: testInfo.outputPath('reload-finished.png') });

  // reopened again after the end: still the finished figure
  await page.notebook.save();
  await reopen(page);
  await expect.poll(async () => (await cellView(page)).points, { timeout: 60_000 }).toEqual(ones);
  expect((await cellView(page)).status).toBe('ok');

  await page.notebook.addCell('code', '%dtrain stop');
  await page.notebook.runCell(2, { inplace: true });
});
