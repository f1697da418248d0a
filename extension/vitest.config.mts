import { defineConfig } from 'vitest/config';

// Unit tests of the panel's data handling; the browser suite lives in ui-tests/ (Playwright).
export default defineConfig({
  test: {
    include: ['src/__tests__/**/*.spec.ts'],
    environment: 'node'
  }
});
