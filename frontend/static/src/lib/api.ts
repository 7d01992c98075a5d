/** JSON requests to the platform's REST API with the session cookie and CSRF token. */

export function csrfToken(): string {
  const meta = document.querySelector<HTMLMetaElement>('meta[name="csrf-token"]');
  if (meta?.content) return meta.content;
  const m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return m ? decodeURIComponent(m[1]) : "";
}

export class ApiError extends Error {
  constructor(public status: number, public body: unknown) {
    super(`HTTP ${status}`);
  }
}

export async function api<T>(method: string, url: string, body?: unknown): Promise<T> {
  const resp = await fetch(url, {
    method,
    credentials: "same-origin",
    headers: {
      Accept: "application/json",
      ...(body !== undefined ? { "Content-Type": "application/json" } : {}),
      ...(method !== "GET" ? { "X-CSRFToken": csrfToken() } : {}),
    },
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  const text = await resp.text();
  let data: unknown = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data as T;
}

/** The human-readable message(s) of a DRF error body, flattened to `field: message` lines. */
export function errorMessages(body: unknown, prefix = ""): string[] {
  if (body === null || body === undefined) return [];
  if (typeof body === "string") return [prefix ? `${prefix}: ${body}` : body];
  if (Array.isArray(body)) return body.flatMap((b) => errorMessages(b, prefix));
  if (typeof body === "object") {
    return Object.entries(body as Record<string, unknown>).flatMap(([k, v]) =>
      errorMessages(v, k === "detail" || k === "non_field_errors" ? prefix : prefix ? `${prefix}.${k}` : k));
  }
  return [String(body)];
}

/** Reads a JSON blob the server embedded with Django's json_script. */
export function embedded<T>(id: string): T | null {
  const el = document.getElementById(id);
  return el?.textContent ? (JSON.parse(el.textContent) as T) : null;
}
