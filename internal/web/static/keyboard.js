// The keyboard of the browser desktop page. The browser client sends
// the physical key of each press (a scancode) and keyboard layout 0,
// and a host maps scancodes by the layout it is told, US English for 0:
// on a French keyboard é came out as 2. So the page names the person's
// layout, which the gateway writes into the connection (its websocket
// URL's kbd parameter), and sends the characters that come with no
// physical key (a character typed by an input method or an on-screen
// keyboard, reported with an empty code) as Unicode keyboard events.

// The layouts the session hosts know (xrdp's xrdp_keyboard.ini), by
// their Windows input locale identifier.
export const layouts = [
  ['0409', 'English (US)'],
  ['0809', 'English (UK)'],
  ['10409', 'English (US, Dvorak)'],
  ['040c', 'French (France)'],
  ['0813', 'Belgian'],
  ['100c', 'French (Switzerland)'],
  ['0407', 'German (Germany, Austria)'],
  ['0807', 'German (Switzerland)'],
  ['040a', 'Spanish (Spain)'],
  ['080a', 'Spanish (Latin America)'],
  ['0410', 'Italian'],
  ['0816', 'Portuguese (Portugal)'],
  ['0416', 'Portuguese (Brazil)'],
  ['0406', 'Danish'],
  ['0414', 'Norwegian'],
  ['041d', 'Swedish'],
  ['040b', 'Finnish'],
  ['0415', 'Polish'],
  ['0419', 'Russian'],
  ['0411', 'Japanese'],
  ['0412', 'Korean'],
];

// A language tag's usual layout: the whole tag first, then its language.
const byLanguage = {
  'en-gb': '0809', 'en-ie': '0809', en: '0409',
  'fr-be': '0813', 'nl-be': '0813', 'fr-ch': '100c', fr: '040c',
  'de-ch': '0807', de: '0407',
  'es-es': '040a', es: '080a',
  it: '0410', 'pt-br': '0416', pt: '0816',
  da: '0406', nb: '0414', nn: '0414', no: '0414', sv: '041d', fi: '040b',
  pl: '0415', ru: '0419', ja: '0411', ko: '0412',
};

function fromLanguage(tag) {
  const t = (tag || '').toLowerCase();
  return byLanguage[t] || byLanguage[t.split('-')[0]];
}

// fromKeys refines the language's guess by the keys the keyboard makes,
// where the browser tells them (navigator.keyboard.getLayoutMap): an
// AZERTY or QWERTZ keyboard is not a US one, whatever the language.
async function fromKeys(guess) {
  if (!navigator.keyboard || !navigator.keyboard.getLayoutMap) {
    return guess;
  }
  let map;
  try {
    map = await navigator.keyboard.getLayoutMap();
  } catch {
    return guess;
  }
  const azerty = map.get('KeyQ') === 'a';
  const qwertz = map.get('KeyY') === 'z';
  const family = (id) => ({ '040c': 'azerty', '0813': 'azerty', '100c': 'qwertz', '0407': 'qwertz', '0807': 'qwertz' })[id] || 'qwerty';
  const want = azerty ? 'azerty' : qwertz ? 'qwertz' : 'qwerty';
  if (family(guess) === want) {
    return guess;
  }
  if (want === 'azerty') return '040c';
  if (want === 'qwertz') return '0407';
  return guess;
}

const remembered = 'deskway-keyboard';

// keyboardLayout is the layout to use: the person's last choice on this
// browser, else the one their keyboard and language suggest.
export async function keyboardLayout() {
  const saved = localStorage.getItem(remembered);
  if (saved && layouts.some(([id]) => id === saved)) {
    return saved;
  }
  let guess;
  for (const tag of navigator.languages || [navigator.language]) {
    guess = fromLanguage(tag);
    if (guess) break;
  }
  return fromKeys(guess || '0409');
}

// fillChoice fills a select with the layouts, the given one selected,
// and remembers what the person picks.
export function fillChoice(select, chosen) {
  for (const [id, name] of layouts) {
    select.add(new Option(name, id, false, id === chosen));
  }
  select.addEventListener('change', () => localStorage.setItem(remembered, select.value));
}

// withLayout is the gateway's websocket URL naming the layout.
export function withLayout(gateway, id) {
  const u = new URL(gateway);
  u.searchParams.set('kbd', id);
  return u.toString();
}

// capturingModule is the client's backend with a session builder that
// hands each session it connects to onSession: the web component keeps
// its session to itself, and Unicode events need it.
export function capturingModule(backend, onSession) {
  class Builder extends backend.SessionBuilder {
    async connect() {
      const session = await super.connect();
      onSession(session);
      return session;
    }
  }
  return { ...backend, SessionBuilder: Builder };
}

// sendUnicode sends, as Unicode keyboard events, the keys that carry a
// character but no physical key, which the client would drop: it knows
// only scancodes. focused tells whether the desktop has the keyboard.
export function sendUnicode(backend, session, focused) {
  const handle = (e) => {
    const s = session();
    if (!s || !focused() || (e.code !== '' && e.code !== 'Unidentified') || [...e.key].length !== 1) {
      return;
    }
    e.preventDefault();
    e.stopImmediatePropagation();
    send(backend, s, [e.type === 'keydown' ? backend.DeviceEvent.unicodePressed(e.key) : backend.DeviceEvent.unicodeReleased(e.key)]);
  };
  // Capturing, so that the page sees the key before the web component.
  window.addEventListener('keydown', handle, true);
  window.addEventListener('keyup', handle, true);
}

function send(backend, session, events) {
  const tx = new backend.InputTransaction();
  for (const ev of events) tx.addEvent(ev);
  session.applyInputs(tx);
}

// typeText types text on the desktop as Unicode keyboard events, a press
// and a release for each character, as sendUnicode sends a key with no
// physical key: the phone's keyboard gives characters, not keys.
export function typeText(backend, session, text) {
  const events = [];
  for (const ch of text) {
    events.push(backend.DeviceEvent.unicodePressed(ch), backend.DeviceEvent.unicodeReleased(ch));
  }
  send(backend, session, events);
}

// pressKey presses and releases the key with the given scancode (0xE0..
// for an extended key).
export function pressKey(backend, session, scancode) {
  send(backend, session, [backend.DeviceEvent.keyPressed(scancode), backend.DeviceEvent.keyReleased(scancode)]);
}
