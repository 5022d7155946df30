// The browser desktop page: IronRDP's web component, with its WebAssembly
// RDP backend, connected through the gateway's /rdp websocket with the
// one-use token the portal put on the page. The password typed here goes
// from this page to the host inside RDP; the gateway only relays it.
import '/static/vendor/iron-remote-desktop.js';
import { Backend, init, enableCredssp, displayControl } from '/static/vendor/iron-remote-desktop-rdp.js';
import { keyboardLayout, fillChoice, withLayout, capturingModule, sendUnicode } from '/static/keyboard.js';
import { touchScreen, touchAsMouse, phoneKeyboard } from '/static/touch.js';

const root = document.getElementById('browser');
const form = document.getElementById('credentials');
const status = document.getElementById('status');
const toolbar = document.getElementById('toolbar');
const screen = document.getElementById('screen');
const ended = document.getElementById('ended');

// What the gateway's refusal (an HTTP status in the RDCleanPath error)
// means to the person in front of the page.
const refusals = {
  400: 'The gateway could not understand this browser client.',
  401: 'The pass for this desktop is not valid any more (it works once, for a short time). Go back to your desktops and open it again.',
  403: 'A gateway policy does not let you reach this desktop from a browser.',
  408: 'The connection took too long to set up. Go back to your desktops and try again.',
  429: 'Too many failed attempts from your address. Wait a few minutes, then open the desktop again from the portal.',
  502: 'The desktop\'s host did not answer, or its certificate is not one the gateway trusts.',
  500: 'The gateway could not set up the connection. Try again in a moment.',
  503: 'The gateway is at its limit of sessions. Try again in a moment.',
};

// Whether the person pressed Disconnect: then the end is theirs.
let disconnecting = false;

// The gateway ends a session whose desktop refused the logon (xrdp shows
// its own "login failed" dialog and says nothing else) with this close
// code on the websocket (closeLogonRefused in the gateway). The client
// does not pass close codes on, so the page notes the code of each
// websocket the client opens.
const logonRefusedCode = 4401;
let closeCode = 0;
const NativeWebSocket = window.WebSocket;
window.WebSocket = class extends NativeWebSocket {
  constructor(...args) {
    super(...args);
    closeCode = 0;
    this.addEventListener('close', (e) => { closeCode = e.code; });
  }
};

function say(text, error) {
  status.textContent = text;
  status.className = error ? 'error' : '';
}

function describe(err) {
  if (err && typeof err.kind === 'function') {
    const details = typeof err.rdcleanpathDetails === 'function' ? err.rdcleanpathDetails() : undefined;
    const code = details && details.httpStatusCode;
    if (code && refusals[code]) {
      return refusals[code];
    }
    switch (err.kind()) {
      case 1: return 'The desktop refused the password.';
      case 2: return 'The desktop refused the logon.';
      case 3: return 'Access to the desktop was denied.';
      case 5: return 'The gateway could not be reached.';
    }
  }
  return 'The desktop could not be reached. Try again in a moment; if it keeps failing, tell your administrator.';
}

// rawDetail is what the client library says of an error: its internals
// (source paths, protocol states), for the portal's log and the browser
// console, never the page.
function rawDetail(err) {
  if (err && typeof err.backtrace === 'function') {
    return err.backtrace();
  }
  return String(err);
}

// logonRefused shows the form again, after the desktop refused the
// user name or password, with a new pass from the portal (the one the
// page had is spent). With single sign-on there is nothing to retype.
async function logonRefused() {
  root.dataset.connected = '';
  toolbar.hidden = true;
  if (root.dataset.sso === 'true') {
    finish('The desktop refused the account the portal logs you on with. Tell your administrator.', true);
    return;
  }
  const d = root.dataset;
  let pass;
  try {
    const resp = await fetch('/browser/pass', {
      method: 'POST',
      credentials: 'same-origin',
      body: new URLSearchParams({ csrf: d.csrf, delivery_group: d.group }),
    });
    pass = await resp.json();
  } catch {
    pass = {};
  }
  if (!pass.token) {
    finish(pass.message || 'The desktop refused that user name or password. Go back to your desktops and open it again.', true);
    return;
  }
  Object.assign(d, { token: pass.token, destination: pass.destination, gateway: pass.gateway, session: pass.session, opened: pass.opened });
  form.hidden = false;
  say('The desktop refused that user name or password. Try again.', true);
  form.elements.password.focus();
}

// explainEnd shows why a connected session ended: the portal asks the broker
// (an administrator's disconnect or logoff, the user's own logoff, or a
// connection lost) and logs what the client said.
async function explainEnd(detail) {
  if (disconnecting) {
    finish('You disconnected. The desktop\'s programs are still running: open it again from your desktops to carry on.', false);
    return;
  }
  say('The connection ended. Finding out why…');
  let text = 'The session ended.';
  try {
    const d = root.dataset;
    const resp = await fetch('/browser/end', {
      method: 'POST',
      credentials: 'same-origin',
      body: new URLSearchParams({ csrf: d.csrf, session: d.session, opened: d.opened, detail: detail }),
    });
    if (resp.ok) {
      text = (await resp.json()).message || text;
    }
  } catch {
    // The portal is away: the plain default stands.
  }
  finish(text, false);
}

function finish(text, error) {
  toolbar.hidden = true;
  screen.hidden = true;
  ended.hidden = false;
  say(text, error);
  document.title = 'Ended: ' + document.title;
}

await init('WARN');
const el = document.createElement('iron-remote-desktop');
let session;
el.module = capturingModule(Backend, (s) => { session = s; });
el.setAttribute('scale', 'fit');
el.setAttribute('flexcenter', 'true');
el.setAttribute('verbose', 'false');
const ready = new Promise((resolve) => el.addEventListener('ready', (e) => resolve(e.detail.irgUserInteraction), { once: true }));
screen.append(el);
const ui = await ready;
fillChoice(form.elements.keyboard, await keyboardLayout());
sendUnicode(Backend, () => session, () => document.activeElement === el);
touchAsMouse(Backend, () => session, screen, el);
phoneKeyboard(Backend, () => session, document.getElementById('keys'), document.getElementById('typing'));
root.dataset.ready = 'true';

// A width that is a multiple of 4: xrdp pads every bitmap to one, and
// the gateway widens each update to its bitmap (the client draws a
// narrower destination sheared), so on a screen of another width the
// updates at its right edge would reach past it and not be drawn. Even
// heights: some hosts refuse odd sizes. A desktop at least 640 by 480
// is shrunk to fit a smaller window; on a phone that made it unreadable,
// so a touch screen gets a desktop of its own size, drawn pixel for
// pixel, and the person pinches to zoom (200 is the least a host takes).
function size() {
  const least = phone() ? 200 : null;
  const w = Math.max(least || 640, screen.clientWidth) & ~3;
  const h = Math.max(least || 480, window.innerHeight - toolbar.offsetHeight) & ~1;
  return { width: w, height: h };
}

function phone() {
  return touchScreen() && screen.clientWidth < 640;
}

// The toolbar offers the phone's keyboard where there is no other.
function fitToolbar() {
  document.getElementById('keys').hidden = !touchScreen();
}

form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const password = form.elements.password.value;
  form.elements.password.value = '';
  form.hidden = true;
  // The toolbar takes its place before the size is measured, so the
  // desktop fits the space left below it.
  toolbar.hidden = false;
  fitToolbar();
  say('Connecting…');
  const d = root.dataset;
  const config = ui.configBuilder()
    .withUsername(form.elements.username.value)
    .withPassword(password)
    .withDestination(d.destination)
    .withProxyAddress(withLayout(d.gateway, form.elements.keyboard.value))
    .withAuthToken(d.token)
    .withDesktopSize(size())
    // xrdp and other hosts without NLA: TLS only, the credentials in the
    // logon packet, where the gateway turns auto-logon on.
    .withExtension(enableCredssp(false))
    .withExtension(displayControl(true))
    .build();
  let connected = false;
  try {
    const session = await ui.connect(config);
    connected = true;
    say('');
    ui.setVisibility(true);
    root.dataset.connected = 'true';
    const end = await session.run();
    if (closeCode === logonRefusedCode) {
      await logonRefused();
      return;
    }
    await explainEnd(end.reason());
  } catch (err) {
    console.warn('the desktop connection failed:', rawDetail(err));
    if (closeCode === logonRefusedCode) {
      await logonRefused();
    } else if (connected) {
      await explainEnd(rawDetail(err));
    } else {
      finish(describe(err), true);
    }
  }
});

// Single sign-on: the gateway logs the session on with the portal
// user's desktop account, so nothing is asked for here.
if (root.dataset.sso === 'true') {
  form.elements.password.required = false;
  form.requestSubmit();
}

document.getElementById('cad').addEventListener('click', () => ui.ctrlAltDel());
document.getElementById('meta').addEventListener('click', () => ui.metaKey());
document.getElementById('disconnect').addEventListener('click', () => {
  disconnecting = true;
  ui.shutdown();
});
document.getElementById('fullscreen').addEventListener('click', async () => {
  await document.documentElement.requestFullscreen();
  // In full screen, keys a browser keeps for itself (Escape, Alt+Tab
  // where the platform allows) go to the desktop.
  if (navigator.keyboard && navigator.keyboard.lock) {
    await navigator.keyboard.lock().catch(() => {});
  }
});

let resizeTimer;
window.addEventListener('resize', () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    fitToolbar();
    if (root.dataset.connected) {
      const s = size();
      ui.resize(s.width, s.height);
    }
  }, 300);
});
