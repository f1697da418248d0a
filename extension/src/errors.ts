/** The error every failed /dtwork/ request raises (no JupyterLab imports: unit-testable). */

export class ApiError extends Error {
  /**
   * @param status HTTP status (0 when the server could not be reached)
   * @param message what the server said (its JSON `error`), or a description
   * @param fromDtwork whether the answer was dtwork's own JSON error, rather than
   *   a page from Jupyter itself (a 404 page means the server extension is missing)
   */
  constructor(
    readonly status: number,
    message: string,
    readonly fromDtwork: boolean
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** Build the ApiError of a non-2xx answer from its status and body text. */
export function apiErrorFrom(status: number, body: string): ApiError {
  try {
    const parsed: unknown = JSON.parse(body);
    if (isErrorReply(parsed)) {
      return new ApiError(status, parsed.error, true);
    }
  } catch {
    // not JSON: an HTML page from Jupyter or a proxy
  }
  return new ApiError(status, `the server answered HTTP ${status}`, false);
}

function isErrorReply(value: unknown): value is { error: string } {
  return (
    typeof value === 'object' && value !== null && typeof (value as { error?: unknown }).error === 'string'
  );
}
