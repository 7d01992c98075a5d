/** Light/dark toggle: follows the system until the user picks one, remembered in localStorage. */

export function initTheme(): void {
  const root = document.documentElement;
  const saved = localStorage.getItem("theme");
  if (saved === "light" || saved === "dark") root.dataset.theme = saved;
  const button = document.getElementById("theme-toggle");
  if (!button) return;
  const effective = () => root.dataset.theme ?? (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
  const sync = () => {
    const dark = effective() === "dark";
    button.setAttribute("aria-pressed", String(dark));
    button.textContent = dark ? "Light theme" : "Dark theme";
  };
  button.addEventListener("click", () => {
    const next = effective() === "dark" ? "light" : "dark";
    root.dataset.theme = next;
    localStorage.setItem("theme", next);
    sync();
    document.dispatchEvent(new CustomEvent("themechange"));
  });
  sync();
}
