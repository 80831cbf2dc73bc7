// The workspace panel: plain JavaScript over the admin REST, with the session's cookie and CSRF
// token. Every value is set as text (textContent), never as markup: titles and reasons are
// written by a model from chat text.
"use strict";

const state = { csrf: "", scope: "", stream: null, thread: null, target: null };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v === true) e.setAttribute(k, "");
    else if (v !== false && v != null) e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

function showError(msg) {
  const box = document.getElementById("error");
  box.textContent = msg;
  box.hidden = !msg;
}

function announce(msg) { document.getElementById("status").textContent = msg; }

async function api(method, path, body) {
  const opts = { method, headers: {}, credentials: "same-origin" };
  if (method !== "GET") opts.headers["X-CSRF-Token"] = state.csrf;
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  if (r.status === 204) return null;
  const data = await r.json().catch(() => null);
  if (!r.ok) {
    const err = new Error(data && data.error ? data.error.message : r.status + " " + r.statusText);
    err.status = r.status;
    throw err;
  }
  return data;
}

// act runs a user action: its failure is shown in the page, never lost.
async function act(fn) {
  showError("");
  try {
    await fn();
  } catch (e) {
    if (e.status === 401) return signInView();
    showError(e.message);
  }
}

function threadPath(id) { return "/admin/v1/threads/" + encodeURIComponent(id); }

async function start() {
  document.getElementById("signout").addEventListener("click", () => act(async () => {
    await api("DELETE", "/ui/session");
    state.csrf = "";
    location.hash = "#/";
    signInView();
  }));
  window.addEventListener("hashchange", route);
  try {
    const s = await api("GET", "/ui/session");
    state.csrf = s.csrf;
    state.scope = s.scope;
  } catch (e) {
    return signInView();
  }
  route();
}

function setMain(...children) {
  const main = document.getElementById("main");
  main.replaceChildren(...children);
}

function signedIn() {
  document.getElementById("who").textContent = "signed in: " + state.scope;
  document.getElementById("signout").hidden = false;
}

function signInView() {
  closeStream();
  document.getElementById("who").textContent = "";
  document.getElementById("signout").hidden = true;
  const token = el("input", { type: "password", id: "token", name: "token", autocomplete: "current-password", required: true });
  const form = el("form", { id: "signin", onsubmit: (ev) => {
    ev.preventDefault();
    act(async () => {
      const s = await api("POST", "/ui/session", { token: token.value });
      state.csrf = s.csrf;
      state.scope = s.scope;
      route();
    });
  } }, el("label", { for: "token" }, "Admin token or client key", token), el("button", { type: "submit" }, "Sign in"));
  setMain(el("h2", { text: "Sign in" }), form);
  token.focus();
}

function route() {
  signedIn();
  const m = location.hash.match(/^#\/t\/(.+)$/);
  if (m) return threadView(decodeURIComponent(m[1]));
  if (state.scope.startsWith("thread:")) {
    location.hash = "#/t/" + encodeURIComponent(state.scope.slice(7));
    return;
  }
  threadsView();
}

function threadsView() {
  closeStream();
  const filter = el("input", { type: "search", id: "filter", name: "q", placeholder: "id prefix" });
  const list = el("ul", { class: "threads", id: "threads" });
  const more = el("button", { type: "button", class: "quiet", hidden: true }, "More");
  let after = "";
  const load = (reset) => act(async () => {
    if (reset) { after = ""; list.replaceChildren(); }
    const q = new URLSearchParams({ q: filter.value, limit: "50" });
    if (after) q.set("after", after);
    const page = await api("GET", "/admin/v1/threads?" + q);
    for (const t of page.data) {
      list.append(el("li", {},
        el("a", { href: "#/t/" + encodeURIComponent(t.id), text: t.id }),
        el("div", { class: "meta", text: t.turns + " turns · " + t.preference_count + " preferences · updated " + new Date(t.updated_at).toLocaleString() }),
        t.objective ? el("div", { class: "objective", text: t.objective }) : null));
      after = t.cursor;
    }
    if (!list.children.length) list.append(el("li", { class: "muted", text: "No threads." }));
    more.hidden = !page.has_more;
  });
  const form = el("form", { role: "search", onsubmit: (ev) => { ev.preventDefault(); load(true); } },
    el("label", { for: "filter" }, "Filter by id", filter), el("button", { type: "submit" }, "Filter"));
  more.addEventListener("click", () => load(false));
  setMain(el("h2", { text: "Threads" }), form, list, more);
  load(true);
}

function describeTarget(t) { return t.type === "objective" ? "objective" : "preference " + t.id; }

function stateText(s) {
  if (s == null) return "(none)";
  if ("text" in s) return s.text;
  return s.title + (s.subtitle ? " — " + s.subtitle : "") + " [" + s.kind + "]" + (s.locked ? " (locked)" : "");
}

async function threadView(id) {
  closeStream();
  state.thread = id;
  state.target = null;
  const path = threadPath(id);
  // The forms are made once: a live update refreshes the values around them, never what the
  // user is typing.
  const objectiveText = el("p", { class: "objective", id: "objective" });
  const objectiveInput = el("input", { type: "text", id: "objective-text", name: "text" });
  const objectiveForm = el("form", { id: "objective-form", onsubmit: (ev) => {
    ev.preventDefault();
    act(async () => { await api("PUT", path + "/objective", { text: objectiveInput.value }); state.reload(); });
  } }, el("label", { for: "objective-text" }, "Objective", objectiveInput), el("button", { type: "submit" }, "Save objective"),
  el("button", { type: "button", class: "quiet", onclick: () => state.showTarget("objective") }, "History"));
  const prefList = el("ul", { class: "prefs", id: "prefs" });
  const title = el("input", { type: "text", id: "new-title", name: "title", required: true });
  const subtitle = el("input", { type: "text", id: "new-subtitle", name: "subtitle" });
  const kind = el("select", { id: "new-kind", name: "kind" }, el("option", { value: "soft" }, "soft"), el("option", { value: "hard" }, "hard"));
  const locked = el("input", { type: "checkbox", id: "new-locked", name: "locked" });
  const addForm = el("form", { id: "add-form", onsubmit: (ev) => {
    ev.preventDefault();
    act(async () => {
      await api("POST", path + "/preferences", { title: title.value, subtitle: subtitle.value, kind: kind.value, locked: locked.checked });
      addForm.reset();
      state.reload();
    });
  } }, el("label", { for: "new-title" }, "Title", title), el("label", { for: "new-subtitle" }, "Subtitle", subtitle),
  el("label", { for: "new-kind" }, "Kind", kind), el("label", { class: "inline", for: "new-locked" }, locked, "Locked"),
  el("button", { type: "submit" }, "Add preference"));
  const timeline = el("ol", { class: "timeline", id: "timeline", "aria-live": "polite" });
  const timelineHead = el("h2", { id: "h-timeline", text: "History" });
  setMain(el("h2", { text: "Thread " + id }), el("div", { class: "columns" },
    el("div", {},
      el("section", { "aria-labelledby": "h-objective" }, el("h2", { id: "h-objective", text: "Objective" }), objectiveText, objectiveForm),
      el("section", { "aria-labelledby": "h-prefs" }, el("h2", { id: "h-prefs", text: "Preferences" }), prefList,
        el("h2", { text: "Add a preference" }), addForm)),
    el("section", { "aria-labelledby": "h-timeline" }, timelineHead, timeline)));

  let reads = 0; // only the latest read's answer is shown: an earlier one may come back later
  const refresh = () => act(async () => {
    const n = ++reads;
    const d = await api("GET", path);
    if (n !== reads) return;
    const text = d.objective ? d.objective.text : "";
    objectiveText.textContent = text || "(none yet)";
    if (document.activeElement !== objectiveInput) objectiveInput.value = text;
    // A preference being edited keeps its form.
    const items = d.preferences.map((p) => prefList.querySelector('li.editing[data-id="' + p.id + '"]') || renderPreference(id, p));
    if (!items.length) items.push(el("li", { class: "muted", text: "No preferences yet." }));
    prefList.replaceChildren(...items);
  });
  // The timeline shows the events known, newest first: those a load read and those the stream
  // brought, whichever came first (a slow load never hides a live event).
  const known = new Map();
  const fresh = new Set();
  const targetOf = (e) => e.target.type === "objective" ? "objective" : "preference:" + e.target.id;
  const renderTimeline = () => {
    const evs = [...known.values()].filter((e) => !state.target || targetOf(e) === state.target).sort((a, b) => b.id - a.id);
    const items = evs.map((e) => renderEvent(e, fresh.has(e.id)));
    if (state.target) items.unshift(el("li", {}, el("button", { type: "button", class: "quiet", onclick: () => state.showTarget(null) }, "Show all history")));
    if (!evs.length) items.push(el("li", { class: "muted", text: "No changes yet." }));
    timelineHead.textContent = state.target ? "History of " + state.target.replace(":", " ") : "History";
    timeline.replaceChildren(...items);
  };
  const loadTimeline = () => act(async () => {
    const q = new URLSearchParams({ order: "desc", limit: "200" });
    if (state.target) q.set("target", state.target);
    const page = await api("GET", path + "/events?" + q);
    for (const e of page.data) known.set(e.id, e);
    renderTimeline();
  });
  state.reload = () => { refresh(); loadTimeline(); };
  state.showTarget = (t) => { state.target = t; renderTimeline(); loadTimeline(); };
  await refresh();
  await loadTimeline();
  openStream(id, (e) => {
    refresh();
    if (known.has(e.id)) return;
    known.set(e.id, e);
    fresh.add(e.id);
    renderTimeline();
    announce(e.actor + " " + e.kind.replaceAll("_", " "));
  });
}

function renderPreference(thread, p) {
  const path = threadPath(thread) + "/preferences/" + p.id;
  const patch = (body) => act(async () => { await api("PATCH", path, body); li.classList.remove("editing"); state.reload(); });
  const li = el("li", { "data-id": String(p.id), class: "pref" });
  const label = "#" + p.index + " " + p.title;
  const show = () => { li.classList.remove("editing"); li.replaceChildren(
    el("span", { class: "grow" }, el("span", { class: "title", text: "#" + p.index + " " + p.title }),
      p.subtitle ? el("span", { class: "subtitle", text: " — " + p.subtitle }) : null),
    el("span", { class: "badge" + (p.locked ? " locked" : ""), text: p.locked ? "locked" : p.kind }),
    el("label", { class: "inline" }, "Kind", el("select", { "aria-label": "Kind of " + label, class: "kind", onchange: (ev) => patch({ kind: ev.target.value }) },
      el("option", { value: "soft", selected: p.kind === "soft" }, "soft"), el("option", { value: "hard", selected: p.kind === "hard" }, "hard"))),
    el("button", { type: "button", class: "quiet lock", "aria-label": (p.locked ? "Unlock " : "Lock ") + label, onclick: () => patch({ locked: !p.locked }) }, p.locked ? "Unlock" : "Lock"),
    el("button", { type: "button", class: "quiet edit", "aria-label": "Edit " + label, onclick: edit }, "Edit"),
    el("button", { type: "button", class: "quiet", "aria-label": "History of " + label, onclick: () => state.showTarget("preference:" + p.id) }, "History"),
    el("button", { type: "button", class: "danger remove", "aria-label": "Remove " + label, onclick: () => act(async () => { await api("DELETE", path); state.reload(); }) }, "Remove")); };
  function edit() {
    li.classList.add("editing");
    const t = el("input", { type: "text", value: p.title, "aria-label": "Title of " + label, class: "edit-title" });
    const s = el("input", { type: "text", value: p.subtitle, "aria-label": "Subtitle of " + label, class: "edit-subtitle" });
    li.replaceChildren(el("form", { onsubmit: (ev) => { ev.preventDefault(); patch({ title: t.value, subtitle: s.value }); } },
      t, s, el("button", { type: "submit" }, "Save"), el("button", { type: "button", class: "quiet", onclick: show }, "Cancel")));
    t.focus();
  }
  show();
  return li;
}

function renderEvent(e, fresh) {
  // An agent's change came in a proxied turn, or over MCP (from an agent elsewhere, in no turn).
  const who = e.actor !== "agent" ? "user" : e.via === "mcp" ? "agent over MCP" : "agent (turn " + e.turn + ", round " + e.round + ")";
  const li = el("li", { class: "event" + (fresh ? " fresh" : ""), "data-event": String(e.id), "data-kind": e.kind, "data-via": e.via },
    el("div", { class: "meta", text: "#" + e.id + " · " + new Date(e.at).toLocaleString() + " · " + who }),
    el("div", { class: "what", text: e.kind.replaceAll("_", " ") + " — " + describeTarget(e.target) + (e.reverts ? " (undoes #" + e.reverts + ")" : "") }),
    e.reason ? el("blockquote", { class: "reason", text: e.reason }) : null,
    el("div", { class: "change", text: stateText(e.before) + "  →  " + stateText(e.after) }));
  if (e.kind !== "locked_skip") {
    li.append(el("button", { type: "button", class: "quiet revert", "aria-label": "Revert change #" + e.id, onclick: () => act(async () => {
      await api("POST", threadPath(e.thread) + "/events/" + e.id + "/revert");
      state.reload();
    }) }, "Revert"));
  }
  return li;
}

function openStream(id, onEvent) {
  const src = new EventSource(threadPath(id) + "/events/stream");
  src.onmessage = (m) => { try { onEvent(JSON.parse(m.data)); } catch (e) { showError("a live update was not understood"); } };
  state.stream = src;
}

function closeStream() {
  if (state.stream) state.stream.close();
  state.stream = null;
}

start();
