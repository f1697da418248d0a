/**
 * On a machine whose every core is busy (a niced CPU hog per core beside the two ranks), the live figure of a
 * training cell still grows while the cell trains (issue 45), not only at its end. The ranks train until
 * the test has seen enough (a flag file), so a slow machine changes how long it takes, not what is seen.
 */
import { expect, type IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import { type ChildProcess, spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import { addCode } from './cells';

/** The last step the loss trace of the last cell's live widget draws (0 before it draws any). */
function liveLoss(page: IJupyterLabPageFixture) {
  return page.evaluate(() => {
    const cells = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell');
    const cell = cells[cells.length - 1];
    const plot = cell?.querySelector('.jupyter-widgets .js-plotly-plot') as
      (HTMLElement & { data?: { name?: string; x?: ArrayLike<number> }[] }) | null;
    const loss = plot?.data?.find(t => t.name === 'loss');
    return loss?.x?.length ? Number(loss.x[loss.x.length - 1]) : 0;
  });
}

test('under a CPU hog on every core the live figure grows while the cell trains', async ({ page }) => {
  test.setTimeout(600_000); // a cluster's start and a training cell on a machine with no core to spare
  const flags = fs.mkdtempSync('/tmp/dtwork-busy-');
  const hogs: ChildProcess[] = [];
  try {
    await page.notebook.createNew('busy.ipynb');
    await page.notebook.setCell(0, 'code', '%load_ext dtwork\n%dtrain start -n 2');
    await page.notebook.runCell(0, { inplace: true });
    for (let i = 0; i < os.cpus().length; i++) {
      // niced: an idle-priority thread still waits behind them, while the other tests beside this one
      // (CI runs it next to the test workers) keep nearly all of their share
      hogs.push(spawn('nice', ['-n', '19', 'python3', '-c', 'while True: pass'], { stdio: 'ignore' }));
    }
    await addCode(
      page,
      '%%dtrain\nimport os, torch, torch.distributed as dist\n' +
        'for step, _ in ctx.steps(range(1_000_000)):\n' +
        '    ctx.log(loss=1.0 / (step + 1))\n' +
        '    sum(i * i for i in range(2000))  # a step of pure Python work: the cores stay busy\n' +
        `    stop = torch.tensor([float(os.path.exists("${flags}/stop"))])\n` +
        '    dist.all_reduce(stop, op=dist.ReduceOp.MAX)\n' +
        '    if stop.item():\n' +
        '        break\n'
    );
    const running = page.notebook.runCell(1, { inplace: true });
    await expect.poll(() => liveLoss(page), { timeout: 180_000 }).toBeGreaterThan(0);
    // three new last steps in a row while the ranks train on: the view moves, not only at the end
    let seen = await liveLoss(page);
    for (let i = 0; i < 3; i++) {
      const before = seen;
      await expect.poll(() => liveLoss(page), { timeout: 60_000 }).toBeGreaterThan(before);
      seen = await liveLoss(page);
    }
    expect(fs.existsSync(`${flags}/stop`)).toBe(false); // all of it seen before the cell was told to end
    fs.writeFileSync(`${flags}/stop`, '');
    await running;
  } finally {
    fs.writeFileSync(`${flags}/stop`, '');
    for (const hog of hogs) {
      hog.kill('SIGKILL');
    }
  }
  await page.notebook.addCell('code', '%dtrain stop');
  await page.notebook.runCell(2, { inplace: true });
});
