// ESLint for the sidebar's sources, their unit tests and the browser tests (flat config).
// Formatting is prettier's job: eslint-config-prettier turns off the rules that would fight it.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: [
      'lib/',
      'node_modules/',
      '.yarn/',
      'ui-tests/node_modules/',
      'ui-tests/.yarn/',
      'ui-tests/test-results/',
      'ui-tests/playwright-report/'
    ]
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    // The sources are checked with their types: floating promises and unsafe `any` are bugs here.
    files: ['src/**/*.ts'],
    extends: [...tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: { project: './tsconfig.test.json', tsconfigRootDir: import.meta.dirname }
    }
  },
  {
    files: ['src/**/*.ts', 'ui-tests/**/*.ts'],
    rules: {
      '@typescript-eslint/naming-convention': [
        'error',
        { selector: 'interface', format: ['PascalCase'], custom: { regex: '^I[A-Z]', match: true } }
      ],
      '@typescript-eslint/no-unused-vars': ['error', { args: 'none', caughtErrors: 'none' }],
      eqeqeq: 'error',
      curly: ['error', 'all'],
      'prefer-arrow-callback': 'error'
    }
  },
  {
    files: ['**/*.js', '**/*.cjs'],
    languageOptions: { sourceType: 'commonjs', globals: globals.node },
    rules: { '@typescript-eslint/no-require-imports': 'off' }
  },
  {
    files: ['**/*.mjs', '**/*.mts'],
    languageOptions: { globals: globals.node }
  },
  prettier
);
