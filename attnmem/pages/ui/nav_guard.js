// Navigation guard (attnmem/pages/ui/navigation.py): runs once per browser tab.
(() => {
  if (window.__attnmemNavGuard) return;
  window.__attnmemNavGuard = true;

  // 1. One history entry per page visit. Streamlit's frontend pushes a history entry for every
  // query-string write (App.handlePageInfoChanged) and one more for the page switch
  // (maybeUpdatePageUrl), so a visit left 2-3 entries and Back needed 2-3 presses, landing
  // first on an entry without the page's inputs. A push to the path already shown is the page
  // writing its own inputs: it replaces the entry instead. Between a click on a page link and
  // the new path (pushed only after React has drawn the new page's navigation), the new page's
  // first writes still see the old path: they would overwrite the old page's entry with the
  // new page's inputs (Back then showed Score matrix's s on Will it fit?). Those are dropped;
  // the path's push carries the new page's query, and its later writes replace it.
  const push = window.history.pushState.bind(window.history);
  let switching = null;  // {from: path, at: ms}: a page link was clicked, its path not shown yet
  window.history.pushState = function (state, title, url) {
    try {
      const path = url == null ? null : new URL(url, window.location.href).pathname;
      if (path === window.location.pathname) {
        if (switching && switching.from === path && performance.now() - switching.at < 10000) {
          return undefined;
        }
        return window.history.replaceState(state, title, url);
      }
    } catch (err) { /* not a URL we can read: leave it to the browser */ }
    switching = null;
    return push(state, title, url);
  };
  window.addEventListener('popstate', () => { switching = null; });
  const leaving = (link) => {  // a click on `link` goes through to Streamlit now
    const to = link.href ? new URL(link.href, window.location.href).pathname : null;
    if (to && to !== window.location.pathname) {
      switching = {from: window.location.pathname, at: performance.now()};
    }
  };

  // 2. A sidebar click right after an edit waits for the edit's run. The frontend sends a
  // number box's un-Entered text when the box loses focus, which a click on a link does only
  // after the link's own rerun request went out: the server took the later request, the old
  // page with the edit, and the page switch was lost. An edit followed by a click before its
  // run ended was cut off by the switch before its page wrote it. So the click is held until
  // the edit's run is over (the page then shows and keeps the edit in its URL), and then
  // clicked again: it always navigates, at the latest after MAX_WAIT_MS.
  const NAV = '[data-testid="stSidebarNav"]';
  const MIN_WAIT_MS = 250;      // the blur's commit and the server's "running" reach the page
  const MAX_WAIT_MS = 8000;
  let lastEdit = -Infinity;  // the user's last press or key on a widget
  let lastIdle = performance.now();  // the last time a run ended
  const busy = () => {
    const app = document.querySelector('[data-testid="stApp"]');
    const s = app ? app.getAttribute('data-test-script-state') : null;
    return s === 'running' || s === 'rerunRequested';
  };
  new MutationObserver(() => { if (!busy()) lastIdle = performance.now(); })
    .observe(document.documentElement, {
      subtree: true, attributes: true, attributeFilter: ['data-test-script-state'] });
  const isEdit = (target) => target instanceof Element && !target.closest(NAV)
      && !!target.closest('[data-testid="stMain"], [data-testid="stSidebar"]');
  for (const kind of ['pointerdown', 'keydown', 'input']) {
    document.addEventListener(kind, (e) => {
      if (isEdit(e.target)) lastEdit = performance.now();
    }, true);
  }
  document.addEventListener('pointerdown', (e) => {
    // focus leaves the box on this press: a pending value is committed after it
    const a = document.activeElement;
    if (e.target instanceof Element && e.target.closest(NAV) && a && a.matches('input, textarea')
        && !a.closest(NAV)) {
      lastEdit = performance.now();
    }
  }, true);
  let released = null;
  document.addEventListener('click', (e) => {
    const target = e.target instanceof Element ? e.target : null;
    const pageLink = target ? target.closest('[data-testid="stPageLink"] a') : null;
    if (pageLink) { leaving(pageLink); return; }
    const link = target ? target.closest(`${NAV} a`) : null;
    if (!link) return;
    if (released === link) { released = null; leaving(link); return; }
    const start = performance.now();
    if (!(lastEdit > lastIdle)) { leaving(link); return; }  // no edit since the last run ended
    e.preventDefault();
    e.stopImmediatePropagation();
    const a = document.activeElement;
    if (a && a !== document.body && a.matches('input, textarea')) a.blur();
    let idle = 0;
    const wait = () => {
      const waited = performance.now() - start;
      idle = busy() ? 0 : idle + 1;
      if (waited >= MAX_WAIT_MS || (waited >= MIN_WAIT_MS && idle >= 3)) {
        released = link;
        link.click();
      } else {
        setTimeout(wait, 20);
      }
    };
    setTimeout(wait, 20);
  }, true);
})();
