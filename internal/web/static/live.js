// Live console lists: the page fetches itself every few seconds and puts
// the fresh rows in place of the part marked data-live, so a session
// disconnected or a host gone unhealthy elsewhere shows without a reload.
// A field being typed in holds the update back until it loses the focus;
// a sign-in that ended stops the updates (the next click signs in again).
const every = 3000;

async function refresh(timer) {
  const live = document.querySelector('[data-live]');
  if (!live || document.hidden) {
    return;
  }
  const focused = document.activeElement;
  if (focused && live.contains(focused) && focused.matches('input, textarea, select')) {
    return;
  }
  let resp;
  try {
    // The header keeps these fetches from renewing the sign-in: an open
    // console left alone still signs out when idle.
    resp = await fetch(location.href, { credentials: 'same-origin', headers: { 'Deskway-Live': '1' } });
  } catch {
    return; // the portal is away for a moment: the next round tries again
  }
  if (resp.redirected || resp.status === 401 || resp.status === 403) {
    clearInterval(timer);
    return;
  }
  if (!resp.ok) {
    return;
  }
  const fresh = new DOMParser().parseFromString(await resp.text(), 'text/html').querySelector('[data-live]');
  if (fresh) {
    live.replaceChildren(...Array.from(fresh.childNodes, (n) => document.importNode(n, true)));
    live.dataset.updated = String(Date.now());
  }
}

const timer = setInterval(() => refresh(timer), every);
document.addEventListener('visibilitychange', () => refresh(timer));
