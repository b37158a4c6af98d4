/** The dashboard's HTML templates: every value is escaped unless it is already markup; the way back after an action stays inside /ui. */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { escapeHtml, html, jsonScript } from "../../src/coordinator/ui/html.js";
import { backTo } from "../../src/coordinator/ui/respond.js";

describe("html templates", () => {
  it("escapes text and attribute values", () => {
    const evil = `"><script>alert('x')</script>&\``;
    assert.equal(html`<td title="${evil}">${evil}</td>`.text, `<td title="&quot;&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&#96;">&quot;&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&#96;</td>`);
    assert.equal(escapeHtml("plain"), "plain");
  });
  it("keeps nested templates as markup and flattens arrays; null, undefined and false render nothing; numbers as text", () => {
    const rows = ["a<b", "c"].map((x) => html`<li>${x}</li>`);
    assert.equal(html`<ul>${rows}${null}${undefined}${false}${0}</ul>`.text, "<ul><li>a&lt;b</li><li>c</li>0</ul>");
  });
  it("JSON for a script element cannot close it", () => {
    assert.equal(jsonScript({ s: "</script><b>" }).text, '{"s":"\\u003c/script>\\u003cb>"}');
  });
});

describe("the way back after an action", () => {
  for (const [raw, want] of [
    ["/ui/pools/ci", "/ui/pools/ci"],
    ["/ui", "/ui"],
    ["//evil.example/ui", "/ui/x"],
    ["https://evil.example/", "/ui/x"],
    ["/ui//evil", "/ui/x"],
    ["/ui/pools/ci?x=1", "/ui/x"],
    [undefined, "/ui/x"],
  ] as Array<[string | undefined, string]>) {
    it(`${String(raw)} -> ${want}`, () => assert.equal(backTo(raw, "/ui/x"), want));
  }
});
