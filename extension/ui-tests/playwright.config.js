/**
 * Playwright configuration for the dtwork sidebar tests (Galata's defaults, headless Chromium
 * from the system: Playwright cannot download its own browser here).
 */
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

const port = process.env.DTWORK_UI_PORT || '8888';

module.exports = {
  ...baseConfig,
  timeout: 240_000,
  expect: { timeout: 30_000 },
  workers: 1,
  retries: 0,
  outputDir: 'test-results',
  reporter: [['list'], ['html', { open: 'never', outputFolder: 'playwright-report' }]],
  use: {
    ...baseConfig.use,
    baseURL: `http://localhost:${port}`,
    video: 'off',
    trace: 'retain-on-failure',
    screenshot: 'only-on-failure',
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH || '/usr/bin/chromium'
    }
  },
  webServer: {
    command: `jupyter lab --config jupyter_server_test_config.py --ServerApp.port=${port}`,
    url: `http://localhost:${port}/lab`,
    timeout: 120_000,
    reuseExistingServer: false,
    gracefulShutdown: { signal: 'SIGTERM', timeout: 15_000 }
  }
};
