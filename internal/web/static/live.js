// Live console lists: the page fetches itself every few seconds and
// brings the part marked data-live up to date with the fresh copy, so a
// session disconnected or a host gone unhealthy elsewhere shows without
// a reload. Only what changed is touched: a row keeps its elements, and
// a button a person is pressing stays the one they press, so the click
// lands (replacing the rows wholesale lost it). A row is matched by its
// session, host or tunnel, never by its place, so that a row appearing
// above cannot hand a pressed button another row's form. A field being
// typed in, or a button held down, holds the update back; a sign-in that
// ended stops the updates (the next click signs in again).
const every = 3000;

function key(n) {
  if (n.nodeType !== Node.ELEMENT_NODE) {
    return '';
  }
  const d = n.dataset;
  return n.id || d.session || d.host || d.tunnel || '';
}

function sameKind(a, b) {
  return a.nodeType === b.nodeType && a.nodeName === b.nodeName && key(a) === key(b);
}

// morph makes old look as fresh does, keeping old's nodes where they fit.
function morph(old, fresh) {
  if (old.nodeType !== Node.ELEMENT_NODE) {
    if (old.nodeValue !== fresh.nodeValue) {
      old.nodeValue = fresh.nodeValue;
    }
    return;
  }
  for (const a of Array.from(old.attributes)) {
    if (!fresh.hasAttribute(a.name)) {
      old.removeAttribute(a.name);
    }
  }
  for (const a of Array.from(fresh.attributes)) {
    if (old.getAttribute(a.name) !== a.value) {
      old.setAttribute(a.name, a.value);
    }
  }
  morphChildren(old, fresh);
}

function morphChildren(old, fresh) {
  const keyed = new Map();
  const unkeyed = [];
  for (const n of Array.from(old.childNodes)) {
    const k = key(n);
    if (k) {
      keyed.set(k, n);
    } else {
      unkeyed.push(n);
    }
  }
  let next = 0;
  const want = Array.from(fresh.childNodes, (f) => {
    const k = key(f);
    let o;
    if (k) {
      o = keyed.get(k);
      keyed.delete(k);
    } else {
      o = unkeyed[next++];
    }
    if (o && sameKind(o, f)) {
      morph(o, f);
      return o;
    }
    return document.importNode(f, true);
  });
  want.forEach((n, i) => {
    if (old.childNodes[i] !== n) {
      old.insertBefore(n, old.childNodes[i] || null);
    }
  });
  while (old.childNodes.length > want.length) {
    old.lastChild.remove();
  }
}

// A button held down waits for its release before the page changes.
let pressed = false;
document.addEventListener('pointerdown', () => { pressed = true; }, true);
for (const ev of ['pointerup', 'pointercancel']) {
  document.addEventListener(ev, () => { pressed = false; }, true);
}

async function refresh(timer) {
  const live = document.querySelector('[data-live]');
  if (!live || document.hidden || pressed) {
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
  if (fresh && !pressed) {
    morphChildren(live, fresh);
    live.dataset.updated = String(Date.now());
  }
}

const timer = setInterval(() => refresh(timer), every);
document.addEventListener('visibilitychange', () => refresh(timer));
