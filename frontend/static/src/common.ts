/** Loaded by every page (base.html): theme toggle and the current-page marker in the navigation. */
import { initTheme } from "./lib/theme";

initTheme();
for (const link of document.querySelectorAll<HTMLAnchorElement>(".nav a")) {
  const here = location.pathname;
  const target = new URL(link.href).pathname;
  if (target === here || (target !== "/" && here.startsWith(target))) link.setAttribute("aria-current", "page");
}
