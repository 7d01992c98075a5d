/** Loaded as a classic script in <head> (before first paint): applies the theme saved in localStorage.
 * It replaces an inline <script>, which the Content-Security-Policy (script-src 'self') does not allow. */
try {
  const t = localStorage.getItem("theme");
  if (t === "light" || t === "dark") document.documentElement.dataset.theme = t;
} catch {
  // storage disabled: follow the system theme
}
