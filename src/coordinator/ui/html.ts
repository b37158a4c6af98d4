/**
 * HTML from template literals with escaping by default: every value
 * interpolated into `html\`…\`` is escaped (text and attribute values alike)
 * unless it is already `Html` (the result of another `html` call). There is
 * no other way to put a string into a page, so a pool name, a reason or an
 * audit subject can never become markup.
 */
export class Html {
  constructor(readonly text: string) {}
  toString(): string {
    return this.text;
  }
}

const ESCAPES: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "`": "&#96;" };
const NEEDS = /[&<>"'`]/g;

export function escapeHtml(s: string): string {
  return s.replace(NEEDS, (c) => ESCAPES[c]!);
}

type Value = Html | string | number | boolean | null | undefined | readonly Value[];

function push(out: string[], v: Value): void {
  if (v === null || v === undefined || v === false) return;
  if (v instanceof Html) out.push(v.text);
  else if (Array.isArray(v)) for (const x of v as readonly Value[]) push(out, x);
  else out.push(escapeHtml(String(v)));
}

/** Parts are collected and joined once (a page of 1,000 rows is one flat string, not a deep chain of concatenations). */
export function html(strings: TemplateStringsArray, ...values: Value[]): Html {
  const out: string[] = [strings[0]!];
  for (let i = 0; i < values.length; i++) {
    push(out, values[i]!);
    out.push(strings[i + 1]!);
  }
  return new Html(out.join(""));
}

/** Trusted markup written in this code base (never data). */
export function trusted(s: string): Html {
  return new Html(s);
}

/** JSON for a `<script type="application/json">` block: `<` escaped so no value can close the element. */
export function jsonScript(v: unknown): Html {
  return new Html(JSON.stringify(v).replace(/</g, "\\u003c").replace(/\u2028/g, "\\u2028").replace(/\u2029/g, "\\u2029"));
}
