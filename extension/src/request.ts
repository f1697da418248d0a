import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { API_NAMESPACE } from './constants';
import { ApiError, apiErrorFrom } from './errors';

/**
 * Call a dtwork REST route (relative to <base_url>/dtwork/) and parse its JSON answer.
 * Raises ApiError on any failure: status 0 when the server cannot be reached.
 */
export async function requestAPI<T>(endPoint: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, API_NAMESPACE, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ApiError(0, `the Jupyter server cannot be reached (${String(error)})`, false);
  }
  const text = await response.text();
  if (!response.ok) {
    throw apiErrorFrom(response.status, text);
  }
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new ApiError(response.status, `not JSON from ${endPoint}`, false);
  }
}
