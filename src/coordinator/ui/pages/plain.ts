/** Pages outside a session: the sign-in form and the error page. */
import { html, type Html } from "../html.js";
import { shell } from "../layout.js";

export function renderSignIn(o: { error?: string } = {}): Html {
  return shell({
    title: "Sign in",
    body: html`<main id="main" class="signin"><h1>berth dashboard</h1>
${o.error ? html`<p class="notice error" role="alert">${o.error}</p>` : ""}
<form method="post" action="/ui/sign-in">
<p><label for="token">API token</label><br><input id="token" name="token" type="password" autocomplete="off" required autofocus spellcheck="false"></p>
<p><button type="submit">Sign in</button></p>
<p class="muted">The token is checked once and is not kept by the browser: the dashboard then uses a short session
(an httpOnly cookie) that ends when you sign out, when it expires, or when the token is revoked.
Create a token with <code>berth token create --org ORG --role operator</code>.</p>
</form></main>`,
  });
}

export function renderError(status: number, message: string, signedIn: boolean): Html {
  return shell({
    title: `Error ${status}`,
    body: html`<main id="main"><h1>Error ${status}</h1><p class="notice error" role="alert">${message}</p>
<p><a href="${signedIn ? "/ui" : "/ui/sign-in"}">${signedIn ? "Back to the overview" : "Sign in"}</a></p></main>`,
  });
}
