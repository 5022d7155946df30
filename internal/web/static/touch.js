// The browser desktop on a touch screen, as a phone's user expects it
// of a remote desktop: one finger is the mouse (a tap clicks, a long
// press or a two-finger tap right-clicks, a drag moves with the button
// held), two fingers pinch to zoom and pan the zoomed desktop, and a
// Keyboard button opens the phone's keyboard, whose characters go to the
// desktop as Unicode keyboard events. The client library knows only the
// mouse: without this a tap reached the desktop as a click at best, a
// drag scrolled the page and nothing opened a keyboard.
import { typeText, pressKey } from '/static/keyboard.js';

// A press held this long without moving is a right click.
const longPressMs = 500;
// A finger that moves less than this (CSS pixels) is still a tap.
const slop = 10;
const maxZoom = 4;

// touchScreen tells whether the page is on a touch screen: the person
// points with a finger, and has no mouse or keyboard to hand.
export function touchScreen() {
  return matchMedia('(pointer: coarse)').matches || navigator.maxTouchPoints > 0;
}

// touchAsMouse turns touches on area (the box the desktop el is drawn in)
// into the desktop's mouse and into zoom and pan of el. session returns
// the connected session, or nothing before it connects.
export function touchAsMouse(backend, session, area, el) {
  let zoom = 1, tx = 0, ty = 0;
  // The gesture under way: null, or {kind: 'pending'|'drag'|'held'|'pinch', ...}.
  let g = null;

  const send = (...events) => {
    const s = session();
    if (!s) return;
    const batch = new backend.InputTransaction();
    for (const e of events) batch.addEvent(e);
    s.applyInputs(batch);
  };
  // at is the desktop's pixel under a point of the page.
  const at = (x, y) => {
    const c = el.shadowRoot && el.shadowRoot.querySelector('canvas');
    const r = c.getBoundingClientRect();
    const px = Math.round((x - r.left) * c.width / r.width);
    const py = Math.round((y - r.top) * c.height / r.height);
    return backend.DeviceEvent.mouseMove(Math.min(Math.max(px, 0), c.width - 1), Math.min(Math.max(py, 0), c.height - 1));
  };
  const click = (x, y, button) => send(at(x, y), backend.DeviceEvent.mouseButtonPressed(button), backend.DeviceEvent.mouseButtonReleased(button));

  const place = () => {
    // The zoomed desktop covers the area: no gap at any edge.
    const w = area.clientWidth, h = area.clientHeight;
    tx = Math.min(0, Math.max(w - w * zoom, tx));
    ty = Math.min(0, Math.max(h - h * zoom, ty));
    el.style.transform = zoom === 1 ? '' : `translate(${tx}px, ${ty}px) scale(${zoom})`;
    el.dataset.zoom = zoom.toFixed(2);
  };
  const two = (ts) => {
    const r = area.getBoundingClientRect();
    const [a, b] = [ts[0], ts[1]];
    return {
      x: (a.clientX + b.clientX) / 2 - r.left,
      y: (a.clientY + b.clientY) / 2 - r.top,
      d: Math.hypot(a.clientX - b.clientX, a.clientY - b.clientY) || 1,
    };
  };

  area.addEventListener('touchstart', (e) => {
    // The page does no scrolling, zooming or mouse emulation of its own
    // here: this is the desktop's mouse.
    e.preventDefault();
    e.stopPropagation();
    if (e.touches.length === 1 && !g) {
      const t = e.touches[0];
      const start = { kind: 'pending', x: t.clientX, y: t.clientY };
      start.timer = setTimeout(() => {
        if (g === start) {
          click(start.x, start.y, 2);
          start.kind = 'held';
        }
      }, longPressMs);
      g = start;
      return;
    }
    if (e.touches.length >= 2) {
      if (g && g.timer) clearTimeout(g.timer);
      if (g && g.kind === 'drag') send(backend.DeviceEvent.mouseButtonReleased(0));
      if (!g || g.kind !== 'pinch') {
        const m = two(e.touches);
        g = { kind: 'pinch', start: m, zoom, tx, ty, moved: false, began: performance.now() };
      }
    }
  }, { passive: false });

  area.addEventListener('touchmove', (e) => {
    e.preventDefault();
    e.stopPropagation();
    if (!g) return;
    if (g.kind === 'pinch' && e.touches.length >= 2) {
      const m = two(e.touches);
      if (Math.abs(m.d - g.start.d) > slop || Math.hypot(m.x - g.start.x, m.y - g.start.y) > slop) {
        g.moved = true;
      }
      // The desktop's point under the fingers' midpoint stays under it.
      zoom = Math.min(maxZoom, Math.max(1, g.zoom * m.d / g.start.d));
      const px = (g.start.x - g.tx) / g.zoom, py = (g.start.y - g.ty) / g.zoom;
      tx = m.x - px * zoom;
      ty = m.y - py * zoom;
      place();
      return;
    }
    const t = e.touches[0];
    if (g.kind === 'pending' && Math.hypot(t.clientX - g.x, t.clientY - g.y) > slop) {
      clearTimeout(g.timer);
      send(at(g.x, g.y), backend.DeviceEvent.mouseButtonPressed(0));
      g.kind = 'drag';
    }
    if (g.kind === 'drag') {
      send(at(t.clientX, t.clientY));
    }
  }, { passive: false });

  const end = (e) => {
    e.preventDefault();
    e.stopPropagation();
    if (!g || e.touches.length > 0) return;
    const t = e.changedTouches[0];
    if (g.timer) clearTimeout(g.timer);
    switch (g.kind) {
      case 'pending':
        click(g.x, g.y, 0);
        break;
      case 'drag':
        send(at(t.clientX, t.clientY), backend.DeviceEvent.mouseButtonReleased(0));
        break;
      case 'pinch':
        if (!g.moved && performance.now() - g.began < longPressMs) {
          const r = area.getBoundingClientRect();
          click(g.start.x + r.left, g.start.y + r.top, 2);
        }
        break;
    }
    g = null;
  };
  area.addEventListener('touchend', end, { passive: false });
  area.addEventListener('touchcancel', end, { passive: false });

  // A phone's window changes height as its address bar comes and goes:
  // the zoom stays, kept inside the new bounds.
  window.addEventListener('resize', place);
}

// Keys of the phone's keyboard that type no character, by the scancode
// the desktop knows them by.
const keys = {
  Enter: 0x1c, Backspace: 0x0e, Tab: 0x0f, Escape: 0x01, Delete: 0xe053,
  ArrowLeft: 0xe04b, ArrowRight: 0xe04d, ArrowUp: 0xe048, ArrowDown: 0xe050, Home: 0xe047, End: 0xe04f,
};

// phoneKeyboard makes button open the phone's keyboard, by focusing
// field (an input kept out of sight), and sends what is typed there to
// the desktop: characters as Unicode keyboard events, whatever the
// keyboard's layout or input method, and Enter, Backspace and the like
// as their keys.
export function phoneKeyboard(backend, session, button, field) {
  const flush = () => {
    const text = field.value;
    field.value = '';
    const s = session();
    if (s && text) typeText(backend, s, text);
  };
  field.addEventListener('input', (e) => {
    // An input method's word is sent when it is done.
    if (!e.isComposing) flush();
  });
  field.addEventListener('compositionend', flush);
  field.addEventListener('keydown', (e) => {
    const code = keys[e.key];
    const s = session();
    if (code === undefined || e.isComposing || !s) return;
    e.preventDefault();
    pressKey(backend, s, code);
  });
  const shown = () => button.setAttribute('aria-pressed', String(document.activeElement === field));
  field.addEventListener('focus', shown);
  field.addEventListener('blur', shown);
  // The button does not take the focus from the field on its way: a tap
  // on it closes the keyboard that is open.
  button.addEventListener('pointerdown', (e) => e.preventDefault());
  button.addEventListener('mousedown', (e) => e.preventDefault());
  button.addEventListener('click', () => {
    if (document.activeElement === field) {
      field.blur();
    } else {
      field.focus({ preventScroll: true });
    }
  });
}
