// The workspace panel: plain JavaScript over the admin REST, with the session's cookie and CSRF
// token. Every value is set as text (textContent), never as markup: titles and reasons are
// written by a model from chat text. A preference is named by its position in the list (#N),
// as the model sees it; an event by what it changed, never by an id.
"use strict";

const state = { csrf: "", scope: "", stream: null, poll: null, thread: null, target: null, notice: "" };

// FADE_MS is how long a live change stays highlighted (panel.css's fade animation lasts as long).
const FADE_MS = 4000;

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

function plural(n, noun) { return n + " " + noun + (n === 1 ? "" : "s"); }

// errorBox is the place of a form's or an item's errors, beside it.
function errorBox() { return el("p", { class: "error", role: "alert", hidden: true }); }

function showIn(box, msg) {
  box.textContent = msg || "";
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
    err.code = data && data.error ? data.error.code : "";
    throw err;
  }
  return data;
}

// act runs a user action; its failure is shown where it happened (report gets the message),
// never lost. A session that ended goes back to the sign-in, saying so.
async function act(fn, report) {
  report = report || ((msg) => showIn(document.getElementById("error"), msg));
  report("");
  try {
    await fn();
  } catch (e) {
    if (e.status === 401) return signInView("Your session has ended: sign in again.");
    report(e.message);
  }
}

function threadPath(id) { return "/admin/v1/threads/" + encodeURIComponent(id); }

async function start() {
  document.getElementById("signout").addEventListener("click", () => act(async () => {
    await api("DELETE", "/ui/session");
    state.csrf = "";
    location.hash = "#/";
    signInView("");
  }));
  window.addEventListener("hashchange", route);
  try {
    const s = await api("GET", "/ui/session");
    state.csrf = s.csrf;
    state.scope = s.scope;
  } catch (e) {
    return signInView("");
  }
  route();
}

function setMain(...children) {
  showIn(document.getElementById("error"), "");
  document.getElementById("main").replaceChildren(...children.filter((c) => c != null));
}

function signedIn() {
  document.getElementById("who").textContent = whoIsSignedIn(state.scope);
  document.getElementById("signout").hidden = false;
}

// whoIsSignedIn says the session's scope in words: the admin, a client, or one thread (a link's).
function whoIsSignedIn(scope) {
  if (scope === "admin") return "Signed in as the admin";
  if (scope.startsWith("client:")) return "Signed in as client " + scope.slice("client:".length);
  if (scope.startsWith("thread:")) {
    const thread = scope.slice("thread:".length);
    const i = thread.indexOf("~"); // a client's thread, in its stored form client~thread
    return i > 0 ? "Signed in for thread " + thread.slice(i + 1) + " of client " + thread.slice(0, i) : "Signed in for thread " + thread;
  }
  return "Signed in";
}

function signInView(message) {
  closeStream();
  document.getElementById("who").textContent = "";
  document.getElementById("signout").hidden = true;
  const token = el("input", { type: "password", id: "token", name: "token", autocomplete: "current-password", required: true,
    "aria-describedby": "token-help signin-error" });
  const box = errorBox();
  box.id = "signin-error";
  const form = el("form", { id: "signin", onsubmit: (ev) => {
    ev.preventDefault();
    showIn(box, "");
    api("POST", "/ui/session", { token: token.value }).then((s) => {
      state.csrf = s.csrf;
      state.scope = s.scope;
      route();
    }, (e) => { // the server's word: a wrong token, or too many tries
      showIn(box, e.message.charAt(0).toUpperCase() + e.message.slice(1) + ".");
      token.select();
    });
  } }, el("label", { for: "token" }, "Admin token or client key", token), el("button", { type: "submit" }, "Sign in"));
  const help = el("div", { id: "token-help", class: "help" },
    el("p", { text: "The admin token is the ADMIN_TOKEN wsproxy runs with. make run prints it, and keeps it in .data/admin-token in the folder you ran it from. When ADMIN_TOKEN is unset, wsproxy makes one at start and prints it once in its log, on the line “ADMIN_TOKEN is unset; generated one for this run”." }),
    el("p", { text: "With CLIENT_KEYS, a client's key signs in to that client's threads. A link from POST /admin/v1/threads/{thread}/links opens its one thread without any key." }));
  setMain(el("h2", { text: "Sign in" }), form, box, help);
  showIn(box, message);
  token.focus();
}

function route() {
  signedIn();
  if (location.hash === "#/clients" && state.scope === "admin") return clientsView();
  const m = location.hash.match(/^#\/t\/(.+)$/);
  if (m) return threadView(decodeURIComponent(m[1]));
  if (state.scope.startsWith("thread:")) {
    location.hash = "#/t/" + encodeURIComponent(state.scope.slice(7));
    return;
  }
  const p = location.hash.match(/^#\/\?parent=(.+)$/);
  threadsView(p ? decodeURIComponent(p[1]) : "");
}

// nameOf is a thread's name in its client's namespace (the stored id less "client~").
function nameOf(id) {
  const i = id.indexOf("~");
  return i > 0 ? id.slice(i + 1) : id;
}

// storedID is the id the admin REST takes for a thread named name by the signed-in client.
function storedID(name) {
  return state.scope.startsWith("client:") ? state.scope.slice("client:".length) + "~" + name : name;
}

// agentName is the product of a User-Agent ("claude-cli/2.0.1 (external, cli)" → "claude-cli/2.0.1").
function agentName(ua) { return ua.split(/\s+/)[0]; }

// threadsView lists the threads, most recently active first, each with what tells it apart:
// its title (or id), a scope's mark and its sessions, the proposals waiting in it, its first
// words, objective, agent, parents and last activity. parent (from #/?parent=NAME) lists the
// sessions of one scope; the search box finds a thread by its name, title, objective or first
// words.
function threadsView(parent) {
  closeStream();
  const filter = el("input", { type: "search", id: "filter", name: "search", placeholder: "name, title, objective, first words" });
  const list = el("ul", { class: "threads", id: "threads" });
  const more = el("button", { type: "button", class: "quiet", hidden: true }, "More");
  const box = errorBox();
  let after = "";
  const load = (reset) => act(async () => {
    const q = new URLSearchParams({ limit: "50" });
    if (filter.value) q.set("search", filter.value);
    if (parent) q.set("parent", parent);
    if (!reset && after) q.set("after", after);
    const page = await api("GET", "/admin/v1/threads?" + q);
    if (reset) { after = ""; list.replaceChildren(); }
    for (const t of page.data) {
      list.append(renderThreadRow(t));
      after = t.cursor;
    }
    if (!list.children.length) {
      list.append(el("li", { class: "muted", text: parent ? "No thread names " + parent + " among its parents yet."
        : filter.value ? "No thread matches “" + filter.value + "”."
          : "No threads yet. A thread starts with its first turn: a chat request that names it (X-Thread-Id, or /threads/{thread}/v1)." }));
    }
    more.hidden = !page.has_more;
  }, (msg) => showIn(box, msg));
  const form = el("form", { role: "search", onsubmit: (ev) => { ev.preventDefault(); load(true); } },
    el("label", { for: "filter" }, "Search", filter), el("button", { type: "submit" }, "Search"));
  more.addEventListener("click", () => load(false));
  // A new scope: a thread others will inherit from, made empty, then opened.
  const scopeName = el("input", { type: "text", id: "new-scope-name", name: "name", required: true, placeholder: "repo-x" });
  const scopeBox = errorBox();
  const scopeForm = el("form", { id: "new-scope-form", hidden: true, onsubmit: (ev) => {
    ev.preventDefault();
    const name = scopeName.value.trim();
    act(async () => {
      await api("PUT", threadPath(storedID(name)));
      location.hash = "#/t/" + encodeURIComponent(storedID(name));
    }, (msg) => showIn(scopeBox, msg));
  } }, el("label", { for: "new-scope-name" }, "Name of the new scope", scopeName), el("button", { type: "submit" }, "Create scope"),
  el("p", { class: "help", text: "A scope holds preferences that other threads inherit: name it among a thread's parents (X-Workspace-Parents, or its page)." }));
  const newScope = el("button", { type: "button", class: "quiet", id: "new-scope", "aria-expanded": "false", "aria-controls": "new-scope-form", onclick: () => {
    scopeForm.hidden = false;
    newScope.setAttribute("aria-expanded", "true");
    scopeName.focus();
  } }, "New scope");
  // What the last action did, said once (a thread's deletion, from its page).
  const notice = el("p", { class: "notice", id: "notice", role: "status", hidden: !state.notice, text: state.notice });
  state.notice = "";
  const clients = state.scope === "admin" ? el("p", {}, el("a", { href: "#/clients", id: "clients-link" }, "Clients and their keys")) : null;
  const head = parent
    ? [el("h2", { text: "Sessions of " + parent }), el("p", {}, el("a", { href: "#/t/" + encodeURIComponent(storedID(parent)), text: "The scope " + parent }), " · ", el("a", { href: "#/", text: "All threads" }))]
    : [el("div", { class: "list-head" }, el("h2", { text: "Threads" }), newScope), clients, scopeForm, scopeBox];
  setMain(...head, notice, form, box, list, more);
  load(true);
}

// clientsView is the admin's page of clients (docs/spec.md §20): create one, see its key once
// (with a copy button), add a key (rotation), revoke a key, delete the client; each client's
// limits and what it used in the current windows (kept live, USAGE_MS), and a form that sets or
// clears each limit. A key is shown only in the answer that made it; the list shows each key's
// prefix.
function clientsView() {
  closeStream();
  const list = el("ul", { class: "clients", id: "clients" });
  const box = errorBox();
  box.id = "clients-error";
  const shown = el("section", { id: "new-key", class: "notice", role: "status", hidden: true });
  const showKey = (name, key) => {
    const copy = el("button", { type: "button", id: "copy-key" }, "Copy");
    copy.addEventListener("click", () => navigator.clipboard.writeText(key).then(
      () => { copy.textContent = "Copied"; },
      () => { copy.textContent = "Copy failed: select the key and copy it"; }));
    const done = el("button", { type: "button", class: "quiet", id: "key-done" }, "Done");
    done.addEventListener("click", () => { shown.hidden = true; shown.replaceChildren(); });
    shown.replaceChildren(el("p", { text: "The new key of " + name + ", shown this once: copy it now. wsproxy keeps only its hash." }),
      el("code", { id: "new-key-value", text: key }), " ", copy, " ", done);
    shown.hidden = false;
  };
  const load = () => act(async () => {
    const page = await api("GET", "/admin/v1/clients");
    list.replaceChildren(...page.data.map(clientItem));
    if (!page.data.length) list.append(el("li", { class: "muted", text: "No clients yet. Once one exists, every /v1 request needs a client key." }));
  }, (msg) => showIn(box, msg));
  const change = (fn) => act(async () => { await fn(); load(); }, (msg) => showIn(box, msg));
  const clientItem = (c) => {
    const path = "/admin/v1/clients/" + encodeURIComponent(c.name);
    const keys = el("ul", { class: "keys" }, ...c.keys.map((k) => el("li", { "data-key": String(k.id) },
      el("code", { text: k.prefix + "…" }),
      el("span", { class: "meta", text: " made " + new Date(k.created_at).toLocaleString() + (k.seeded ? " · from CLIENT_KEYS" : "") + " " }),
      el("button", { type: "button", class: "quiet revoke-key", "aria-label": "Revoke key " + k.prefix + "… of " + c.name,
        onclick: () => change(() => api("DELETE", path + "/keys/" + k.id)) }, "Revoke"))));
    const add = el("button", { type: "button", class: "add-key", "aria-label": "Add a key to " + c.name,
      onclick: () => act(async () => { const k = await api("POST", path + "/keys"); showKey(c.name, k.key); load(); }, (msg) => showIn(box, msg)) }, "Add a key");
    // Deleting asks first, in the page: its keys end, its threads stay.
    const sure = el("button", { type: "button", class: "danger confirm-delete", hidden: true, "aria-label": "Delete " + c.name + " for good",
      onclick: () => change(() => api("DELETE", path)) }, "Delete " + c.name + ": its keys end, its threads stay");
    const del = el("button", { type: "button", class: "quiet delete-client", "aria-label": "Delete client " + c.name,
      onclick: () => { sure.hidden = false; sure.focus(); } }, "Delete");
    const usage = el("p", { class: "usage" });
    renderClientUsage(usage, c);
    return el("li", { "data-client": c.name },
      el("strong", { text: c.name }),
      el("div", { class: "meta", text: "made " + new Date(c.created_at).toLocaleString() + " · " +
        (c.last_used_at ? "last used " + new Date(c.last_used_at).toLocaleString() : "never used") }),
      usage, limitsForm(c, path), keys, add, " ", del, " ", sure);
  };
  // limitsForm sets or clears each of a client's limits (docs/spec.md §20): a whole number from
  // 1, empty for none. The server is the judge of a value (0 is refused, its words shown in the
  // page's error box), so the browser's own checks are off; a field that is no number at all
  // (the browser reads it as empty) is refused here rather than taken as "none".
  const limitsForm = (c, path) => {
    const lim = c.limits || {};
    const help = "limits-help-" + c.name;
    const fields = LIMITS.map(([key, label]) => {
      const input = el("input", { type: "number", id: "limit-" + c.name + "-" + key, name: key, min: "1", step: "1", inputmode: "numeric",
        "aria-label": label + " of " + c.name, value: lim[key] == null ? "" : String(lim[key]), "aria-describedby": help + " clients-error" });
      return [key, label, input];
    });
    const form = el("form", { class: "limits", novalidate: true, "aria-label": "Limits of " + c.name, onsubmit: (ev) => {
      ev.preventDefault();
      change(async () => {
        const body = {};
        for (const [key, label, input] of fields) {
          if (input.validity.badInput) throw new Error(label + " must be a whole number, or empty for none");
          body[key] = input.value.trim() === "" ? null : Number(input.value);
        }
        await api("PATCH", path, { limits: body });
        announce("The limits of " + c.name + " are saved");
      });
    } }, ...fields.map(([key, label, input]) => el("label", { for: input.id }, label, input)),
    el("button", { type: "submit", class: "quiet", "aria-label": "Save the limits of " + c.name }, "Save limits"),
    el("p", { id: help, class: "help", text: "Each a whole number from 1; empty for no limit. Windows are UTC: a calendar minute, a calendar day." }));
    return form;
  };
  // The usage is kept live while the page shows: each client's line is read again every
  // USAGE_MS (the forms are left as they are).
  const refresh = () => api("GET", "/admin/v1/clients").then((page) => {
    for (const c of page.data) {
      const line = list.querySelector('li[data-client="' + CSS.escape(c.name) + '"] > p.usage');
      if (line) renderClientUsage(line, c);
    }
  }, (e) => { if (e.status === 401) signInView("Your session has ended: sign in again."); });
  const name = el("input", { id: "client-name", name: "name", required: true, pattern: "[A-Za-z0-9._\\-]{1,64}",
    "aria-describedby": "client-help" });
  const form = el("form", { id: "client-form", onsubmit: (ev) => {
    ev.preventDefault();
    act(async () => {
      const c = await api("POST", "/admin/v1/clients", { name: name.value });
      showKey(c.name, c.key);
      form.reset();
      load();
    }, (msg) => showIn(box, msg));
  } }, el("label", { for: "client-name" }, "New client", name), el("button", { type: "submit" }, "Create"));
  const help = el("p", { id: "client-help", class: "help", text: "A name of 1-64 letters, digits, dots, underscores and dashes: its threads are name~thread." });
  setMain(el("nav", { class: "back", "aria-label": "Back" }, el("a", { href: "#/" }, "← All threads")),
    el("h2", { text: "Clients" }), form, help, box, shown, list);
  load();
  state.poll = setInterval(() => { if (!document.hidden) refresh(); }, USAGE_MS);
}

// USAGE_MS is how often the Clients page reads its clients' usage again.
const USAGE_MS = 5000;

// LIMITS are a client's limits (docs/spec.md §20), by their REST names, with their labels.
const LIMITS = [["requests_per_minute", "Requests per minute"], ["tokens_per_day", "Tokens per day"], ["max_threads", "Max threads"]];

// count is n of noun in words: "1 request", "3,400 tokens".
function count(n, noun) { return (n || 0).toLocaleString("en-US") + " " + noun + (n === 1 ? "" : "s"); }

// renderClientUsage says a client's limits and its usage in the current windows, e.g. "12
// requests this minute of 600 · 40 requests today · 3,400 tokens today of 1,000,000 · no thread
// limit". A server that counts nothing (usage null) says the limits alone.
function renderClientUsage(line, c) {
  const lim = c.limits || {};
  const u = c.usage;
  const of = (n) => n == null ? ", no limit" : " of " + n.toLocaleString("en-US");
  const parts = u
    ? [["requests_this_minute", count(u.requests_this_minute, "request") + " this minute" + of(lim.requests_per_minute)],
      ["requests_today", count(u.requests_today, "request") + " today"],
      ["tokens_today", count(u.tokens_today, "token") + " today" + of(lim.tokens_per_day)]]
    : [["requests_per_minute", lim.requests_per_minute == null ? "no request limit" : "at most " + count(lim.requests_per_minute, "request") + " a minute"],
      ["tokens_per_day", lim.tokens_per_day == null ? "no token limit" : "at most " + count(lim.tokens_per_day, "token") + " a day"]];
  parts.push(["max_threads", lim.max_threads == null ? "no thread limit" : "at most " + count(lim.max_threads, "thread")]);
  line.replaceChildren(...parts.flatMap(([key, text], i) => [i ? " · " : null, el("span", { "data-usage": key, text })]).filter((n) => n != null));
}

// renderThreadRow is one thread of the list.
function renderThreadRow(t) {
  const name = t.title || nameOf(t.id);
  const marks = [];
  if (t.children > 0) marks.push(el("span", { class: "badge scope", text: "scope" }));
  if (t.pending_proposals > 0) marks.push(el("span", { class: "badge waiting", text: plural(t.pending_proposals, "proposal") + " waiting" }));
  const meta = [plural(t.turns, "turn") + " · " + plural(t.preference_count, "preference")];
  if (t.agent) meta.push(" · ", el("span", { class: "agent", title: t.agent, text: agentName(t.agent) }));
  if ((t.parents || []).length) {
    meta.push(" · in ");
    t.parents.forEach((p, i) => meta.push(i ? ", " : null, el("a", { href: "#/?parent=" + encodeURIComponent(p), class: "parent", title: "Sessions of " + p, text: p })));
  }
  meta.push(" · last active " + new Date(t.updated_at).toLocaleString());
  return el("li", { "data-thread": t.id },
    el("div", { class: "row-head" }, el("a", { href: "#/t/" + encodeURIComponent(t.id), class: "thread-link", text: name }), ...marks),
    t.title ? el("div", { class: "thread-id", text: nameOf(t.id) }) : null,
    t.first_words ? el("div", { class: "first-words", text: quote(t.first_words) }) : null,
    t.objective ? el("div", { class: "objective", text: t.objective }) : null,
    el("div", { class: "meta" }, ...meta.filter((n) => n != null)),
    t.children > 0 ? el("a", { href: "#/?parent=" + encodeURIComponent(nameOf(t.id)), class: "sessions", text: "Its " + plural(t.children, "session") }) : null);
}

// noSuchThreadView says a thread does not exist; anyone but a link's holder may create it there,
// empty (a scope is named before it holds anything).
function noSuchThreadView(id) {
  const linked = state.scope.startsWith("thread:");
  const box = errorBox();
  setMain(el("section", { id: "no-thread" },
    el("h2", { text: "No such thread" }),
    el("p", { text: "There is no thread “" + id + "”" + (linked ? " that this link opens." : ".") + " A thread starts with its first turn: a chat request that names it." }),
    linked ? null : el("p", {}, "A scope, a thread whose preferences others inherit, can start empty: ",
      el("button", { type: "button", id: "create-thread", onclick: () => act(async () => {
        await api("PUT", threadPath(id));
        threadView(id);
      }, (msg) => showIn(box, msg)) }, "Create it")),
    box,
    linked ? null : el("p", {}, el("a", { href: "#/" }, "All threads"))));
}

// The words of events. pos names a preference by its place in the list now (#N), when it is
// there; titles come from the event's own before and after.
function quote(s) { return "“" + s + "”"; }

function prefName(pos, id, s) {
  const n = pos.get(id);
  return (n ? "#" + n + " " : "") + quote(s.title);
}

function targetName(pos, e) {
  if (e.target.type === "objective") return "the objective";
  if (e.target.type === "thread") return "the thread";
  if (!e.target.id) return quote((e.proposed || {}).title || ""); // a proposed addition
  const s = e.after || e.before;
  if (!s) return pos.has(e.target.id) ? "#" + pos.get(e.target.id) : "a preference"; // a dismissal
  return prefName(pos, e.target.id, s);
}

function fieldsText(s) {
  return quote(s.title) + (s.subtitle ? " — " + s.subtitle : "") + " [" + s.kind + "]";
}

function changes(b, a) {
  const out = [];
  if (b.title !== a.title) out.push(quote(b.title) + " → " + quote(a.title));
  if (b.subtitle !== a.subtitle) out.push("subtitle " + (b.subtitle ? quote(b.subtitle) : "(none)") + " → " + (a.subtitle ? quote(a.subtitle) : "(none)"));
  if (b.kind !== a.kind) out.push(b.kind + " → " + a.kind);
  if (b.locked !== a.locked) out.push(a.locked ? "locked" : "unlocked");
  return out.join(", ");
}

function sameFields(a, b) { return a.title === b.title && a.subtitle === b.subtitle && a.kind === b.kind; }

// describe is what an event did, in words: "Added #2 “Small hotels”".
function describe(e, pos, known) {
  const name = targetName(pos, e);
  const applied = appliedProposal(e, known);
  if (applied) return "Applied the assistant's proposal: " + proposalText(applied, pos);
  switch (e.kind) {
    case "objective_set":
      if (!e.before) return "Set the objective: " + quote(e.after.text);
      if (!e.after) return "Cleared the objective (it was " + quote(e.before.text) + ")";
      return "Changed the objective: " + quote(e.before.text) + " → " + quote(e.after.text);
    case "preference_added": return "Added " + name + " [" + e.after.kind + "]" + (e.after.locked ? ", locked" : "");
    case "preference_updated": { // a new title names it in the change
      const n = pos.get(e.target.id);
      const who = e.before.title !== e.after.title ? (n ? " #" + n : "") : " " + prefName(pos, e.target.id, e.before);
      return "Changed" + who + ": " + changes(e.before, e.after);
    }
    case "preference_locked": return "Locked " + name;
    case "preference_unlocked": return "Unlocked " + name;
    case "preference_removed": return "Removed " + name;
    case "revert": {
      const undone = known.get(e.reverts);
      return undone ? "Undid: " + describe(undone, pos, known) : "Undid an earlier change of " + name;
    }
    case "locked_skip":
      if (e.proposed === null) return "The assistant wanted to remove " + name + ", which is locked";
      if (e.proposed) return "The assistant wanted to change " + name + ", which is locked, to " + fieldsText(e.proposed);
      return "The assistant wanted to change " + name + ", which is locked";
    case "proposed": return "The assistant proposed: " + proposalText(e, pos);
    case "proposal_dismissed": {
      const p = known.get(e.answers);
      return p ? "Dismissed: " + describe(p, pos, known) : "Dismissed a proposal of the assistant";
    }
    case "shared_with_set": {
      const cs = (e.after && e.after.shared_with) || [];
      return cs.length ? "Shared with " + (cs[0] === "*" ? "every client" : cs.join(", ")) : "Unshared";
    }
    case "parents_set": {
      const ps = (e.after && e.after.parents) || [];
      return ps.length ? "Set the parents: " + ps.join(", ") : "Removed the parents";
    }
    case "agent_writes_set": return "Set the assistant's writes: " + writesText(e.after && e.after.agent_writes);
    case "untrusted_writes_set": return "Set what becomes of the assistant's changes from content you did not write: " + untrustedText(e.after && e.after.untrusted_writes);
    case "preference_moved":
      return e.after ? "Moved " + name + " here from " + e.moved.from : "Moved " + quote(e.before.title) + " to " + e.moved.to;
    case "compaction": return "The client compacted its history"; // docs/spec.md §18: the workspace carries on
  }
  return e.kind.replaceAll("_", " ") + ": " + name;
}

// appliedProposal is the proposal a user's change applied (its answers), when it is known; null
// for any other event. A proposal the page has not read yet is read (answered).
function appliedProposal(e, known) {
  if (!e.answers || e.actor !== "user" || e.kind === "proposal_dismissed") return null;
  const p = known.get(e.answers);
  return p && (p.kind === "proposed" || p.kind === "locked_skip") ? p : null;
}

// writesText is a review setting (agent_writes) in words; null is the parents'.
function writesText(mode) {
  if (mode === "propose") return "propose (review mode: the user applies or dismisses each change)";
  if (mode === "direct") return "direct (its changes count at once)";
  return "as the parents say (inherited)";
}

// untrustedText is an untrusted_writes setting in words (docs/spec.md §19); null is the parents'.
function untrustedText(mode) {
  if (mode === "propose") return "propose (you review each)";
  if (mode === "apply") return "apply, marked unconfirmed";
  if (mode === "refuse") return "refuse (nothing written)";
  return "as the parents say (inherited)";
}

// proposalText is what a proposal (review mode's, or a locked item's) would change: add “X”,
// #n's fields, a removal, the objective.
function proposalText(e, pos) {
  if (e.kind === "locked_skip") {
    const name = prefName(pos, e.target.id, e.before) + " (locked)";
    return e.proposed === null ? "remove " + name : "change " + name + " to " + fieldsText(e.proposed);
  }
  if (e.target.type === "objective") return "objective: " + quote(e.proposed.text);
  if (!e.target.id) return "add " + fieldsText(e.proposed);
  const name = prefName(pos, e.target.id, e.before);
  if (e.proposed === null) return "remove " + name;
  // A new title names it in the change, as describe does.
  const n = pos.get(e.target.id);
  const who = e.before.title !== e.proposed.title && n ? "#" + n : name;
  return "update " + who + ": " + changes(e.before, Object.assign({ locked: e.before.locked }, e.proposed));
}

// whoText is who made a change: a user, the assistant in a proxied turn, or an assistant over MCP
// (from an agent elsewhere, in no turn).
function whoText(e) {
  if (e.actor === "client") return "a client's request";
  if (e.actor !== "agent") return "a user";
  return e.via === "mcp" ? "the assistant over MCP" : "the assistant · turn " + e.turn;
}

function targetKey(t) { return t.type === "preference" ? "preference:" + t.id : t.type; }

// UNDONE are the events that changed nothing (proposals and their dismissals, a client's
// compaction), and SETTINGS those that are changed by setting them again, not reverted; a move is
// undone by moving it back.
const UNDONE = new Set(["locked_skip", "proposed", "proposal_dismissed", "compaction"]);
const SETTINGS = new Set(["parents_set", "agent_writes_set", "untrusted_writes_set", "preference_moved", "shared_with_set"]);

// laterChanges maps each target to its last change (a locked_skip changed nothing), and each
// event a revert undid to that revert.
function history(known) {
  const last = new Map();
  const revertedBy = new Map();
  for (const e of known.values()) {
    if (!UNDONE.has(e.kind)) {
      const k = targetKey(e.target);
      if (!last.has(k) || last.get(k) < e.id) last.set(k, e.id);
    }
    if (e.kind === "revert") revertedBy.set(e.reverts, e);
  }
  return { last, revertedBy };
}

// pending is whether a proposal can still be applied: no one applied or dismissed it (the
// server's list of pending ones holds it), its target has not changed since, and a locked item's
// would change something.
function pending(e, h, pos, open) {
  if (!open.has(e.id)) return false;
  if (e.target.type === "preference" && e.target.id && !pos.has(e.target.id)) return false;
  if ((e.target.type === "objective" || e.target.id) && (h.last.get(targetKey(e.target)) || 0) > e.id) return false;
  return e.kind !== "locked_skip" || e.proposed === null || !sameFields(e.proposed, e.before);
}

async function threadView(id) {
  closeStream();
  state.thread = id;
  state.target = null;
  const path = threadPath(id);
  // The history is read before the workspace, and the live stream starts after the newest event
  // that read saw (docs/spec.md §13): whatever commits after it comes through the stream, and
  // the workspace read after it is never older than the history.
  // A link's holder sees its one thread: it neither names nor lists others (parents, moves,
  // children).
  const linked = state.scope.startsWith("thread:");
  let detail, page, proposals, children = [];
  try {
    page = await api("GET", path + "/events?" + timelineQuery());
    [detail, proposals] = await Promise.all([api("GET", path), api("GET", path + "/proposals?limit=500")]);
    if (!linked) children = (await api("GET", path + "/children?limit=500")).data;
  } catch (e) {
    if (e.status === 404) return noSuchThreadView(id);
    if (e.status === 401) return signInView("Your session has ended: sign in again.");
    setMain(el("h2", { text: "Thread " + id }), el("p", { class: "error", role: "alert", text: e.message }));
    return;
  }
  // The forms are made once: a live update refreshes the values around them, never what the
  // user is typing.
  const objectiveText = el("p", { class: "objective", id: "objective" });
  const objectiveInput = el("input", { type: "text", id: "objective-text", name: "text" });
  const objectiveBox = errorBox();
  const objectiveForm = el("form", { id: "objective-form", onsubmit: (ev) => {
    ev.preventDefault();
    act(async () => { await api("PUT", path + "/objective", { text: objectiveInput.value }); state.reload(); }, (msg) => showIn(objectiveBox, msg));
  } }, el("label", { for: "objective-text" }, "Objective", objectiveInput), el("button", { type: "submit" }, "Save objective"),
  el("button", { type: "button", class: "quiet", onclick: () => state.showTarget("objective") }, "History"));
  const prefList = el("ul", { class: "prefs", id: "prefs" });
  const title = el("input", { type: "text", id: "new-title", name: "title", required: true });
  const subtitle = el("input", { type: "text", id: "new-subtitle", name: "subtitle" });
  const kind = el("select", { id: "new-kind", name: "kind" }, el("option", { value: "soft" }, "soft"), el("option", { value: "hard" }, "hard"));
  const locked = el("input", { type: "checkbox", id: "new-locked", name: "locked" });
  const addBox = errorBox();
  addBox.id = "add-error";
  const addForm = el("form", { id: "add-form", onsubmit: (ev) => {
    ev.preventDefault();
    act(async () => {
      await api("POST", path + "/preferences", { title: title.value, subtitle: subtitle.value, kind: kind.value, locked: locked.checked });
      addForm.reset();
      state.reload();
    }, (msg) => showIn(addBox, msg));
  } }, el("label", { for: "new-title" }, "Title", title), el("label", { for: "new-subtitle" }, "Subtitle", subtitle),
  el("label", { for: "new-kind" }, "Kind", kind), el("label", { class: "inline", for: "new-locked" }, locked, "Locked"),
  el("button", { type: "submit" }, "Add preference"));
  // Scopes (docs/spec.md §17): the proposals waiting for the user, what the parents give, the
  // parents, the review setting, and the threads that inherit this one.
  const proposalList = el("ul", { class: "proposals", id: "proposals" });
  const proposalSection = el("section", { "aria-labelledby": "h-proposals", id: "review", hidden: true },
    el("h2", { id: "h-proposals", text: "To review" }), proposalList);
  const inheritedList = el("div", { id: "inherited" });
  const parentsInput = el("input", { type: "text", id: "parents-text", name: "parents", placeholder: "repo-x, alice", "aria-describedby": "parents-help" });
  const parentsBox = errorBox();
  const parentsForm = linked ? null : el("form", { id: "parents-form", onsubmit: (ev) => {
    ev.preventDefault();
    const parents = parentsInput.value.split(",").map((s) => s.trim()).filter((s) => s);
    act(async () => { await api("PUT", path + "/parents", { parents }); parentsInput.blur(); state.reload(); }, (msg) => showIn(parentsBox, msg));
  } }, el("label", { for: "parents-text" }, "Parents, nearest first", parentsInput), el("button", { type: "submit" }, "Save parents"));
  const writesSelect = el("select", { id: "agent-writes", name: "agent_writes", "aria-describedby": "agent-writes-now" });
  const writesNow = el("p", { class: "help", id: "agent-writes-now" });
  const writesBox = errorBox();
  writesSelect.addEventListener("change", () => act(async () => {
    await api("PATCH", path, { agent_writes: writesSelect.value || null });
    state.reload();
  }, (msg) => showIn(writesBox, msg)));
  const childList = el("ul", { class: "children", id: "children" });
  const scopeSection = el("section", { "aria-labelledby": "h-scopes", id: "scopes" },
    el("h2", { id: "h-scopes", text: "Inherited preferences" }),
    el("p", { class: "help", id: "parents-help", text: "A thread inherits its parents' preferences (and theirs), nearest first: the assistant sees them and cannot change them. Change them on their own page." }),
    inheritedList, parentsForm, parentsBox,
    el("h2", { id: "h-writes", text: "The assistant's changes" }),
    el("label", { for: "agent-writes" }, "How the assistant writes", writesSelect), writesNow, writesBox,
    linked ? null : el("h2", { id: "h-children", text: "Inherited by" }), linked ? null : childList);
  const timeline = el("ol", { class: "timeline", id: "timeline", "aria-live": "polite" });
  const timelineHead = el("h2", { id: "h-timeline", text: "History" });
  const timelineBox = errorBox();
  const historySection = el("section", { "aria-labelledby": "h-timeline", id: "history" }, timelineHead, timelineBox, timeline);
  // On a narrow screen the history comes after the workspace: one tap brings it up.
  const jump = el("button", { type: "button", class: "quiet jump", id: "to-history", onclick: () => historySection.scrollIntoView() }, "History ↓");
  const reviewBadge = el("span", { class: "badge review", id: "review-mode", hidden: true, text: "review mode" });
  // The way back to the list (a link's holder has no list: its one thread is its panel).
  const back = linked ? null : el("nav", { class: "back", "aria-label": "Back" }, el("a", { href: "#/", id: "back" }, "← All threads"));
  // Deleting the thread asks first, in the page: what goes, and that it cannot be undone.
  const deleteBox = errorBox();
  const deleteConfirm = el("div", { class: "confirm", id: "delete-confirm", role: "group", "aria-labelledby": "delete-question", hidden: true });
  const deleteButton = linked ? null : el("button", { type: "button", class: "danger", id: "delete-thread", "aria-expanded": "false", "aria-controls": "delete-confirm",
    onclick: () => {
      const cancel = el("button", { type: "button", class: "quiet", id: "delete-cancel", onclick: () => {
        deleteConfirm.hidden = true;
        deleteButton.setAttribute("aria-expanded", "false");
        deleteButton.focus();
      } }, "Cancel");
      deleteConfirm.replaceChildren(
        el("p", { id: "delete-question", text: "Delete thread " + id + "? Its objective, its preferences and all its history are erased. This cannot be undone." }),
        el("button", { type: "button", class: "danger", id: "delete-yes", onclick: () => act(async () => {
          await api("DELETE", path);
          state.notice = "Deleted thread " + id + ".";
          location.hash = "#/";
        }, (msg) => showIn(deleteBox, msg)) }, "Delete thread " + id),
        cancel, deleteBox);
      deleteConfirm.hidden = false;
      deleteButton.setAttribute("aria-expanded", "true");
      cancel.focus(); // the safe choice first
    } }, "Delete thread…");
  // The thread's token usage, summed over its turns as the upstream reported them.
  const usage = el("dl", { class: "usage", id: "usage" });
  // The user's name of the thread (in the list, it stands for the id), and what its first turn
  // said of it.
  const titleInput = el("input", { type: "text", id: "title-text", name: "title", maxlength: "200", placeholder: "a name for this thread" });
  const titleBox = errorBox();
  const titleForm = el("form", { id: "title-form", onsubmit: (ev) => {
    ev.preventDefault();
    act(async () => { await api("PATCH", path, { title: titleInput.value }); titleInput.blur(); state.reload(); }, (msg) => showIn(titleBox, msg));
  } }, el("label", { for: "title-text" }, "Thread title", titleInput), el("button", { type: "submit" }, "Save title"));
  const origin = el("p", { class: "help", id: "origin" });
  setMain(back, el("div", { class: "thread-head" }, el("h2", {}, "Thread " + id + " ", reviewBadge), jump, deleteButton), deleteConfirm, titleForm, titleBox, origin, el("div", { class: "columns" },
    el("div", {},
      proposalSection,
      el("section", { "aria-labelledby": "h-objective" }, el("h2", { id: "h-objective", text: "Objective" }), objectiveText, objectiveForm, objectiveBox),
      el("section", { "aria-labelledby": "h-usage", id: "usage-section" }, el("h2", { id: "h-usage", text: "Token usage" }), usage,
        el("p", { class: "help", text: "Summed over the thread's turns, as the upstream reported them. Cached and cache writes are parts of the prompt tokens." })),
      el("section", { "aria-labelledby": "h-prefs" }, el("h2", { id: "h-prefs", text: "Preferences" }), prefList,
        el("h2", { text: "Add a preference" }), addForm, addBox),
      scopeSection),
    historySection));

  // The timeline shows the events known, newest first: those a load read and those the stream
  // brought, whichever came first (a slow load never hides a live event).
  const known = new Map();
  const fresh = new Map(); // event id or "preference:N" → when it arrived live
  const errors = new Map(); // event id or "preference:N" → the message of its last failed action
  const freshness = (key) => {
    const at = fresh.get(key);
    if (at === undefined) return null;
    const age = Date.now() - at;
    if (age >= FADE_MS) { fresh.delete(key); return null; }
    return age;
  };
  // aside holds the proposals that applied changes answer, read on their own when the history
  // read does not hold them (answered: those asked for); contexts the latest write event with a
  // context of each unconfirmed item ("preference:N", "objective"), read once.
  const aside = new Map();
  const answered = new Set();
  const lookup = { get: (eid) => known.get(eid) || aside.get(eid), has: (eid) => known.has(eid) || aside.has(eid) };
  const contexts = new Map();
  const readAnswered = () => {
    for (const e of known.values()) {
      if (!e.answers || e.actor !== "user" || lookup.has(e.answers) || answered.has(e.answers)) continue;
      answered.add(e.answers);
      api("GET", path + "/events?" + new URLSearchParams({ after: String(e.answers - 1), limit: "1" })).then((pg) => {
        if (pg.data.length && pg.data[0].id === e.answers) { aside.set(e.answers, pg.data[0]); render(); }
      }, () => {});
    }
  };
  const readContexts = (targets) => {
    for (const t of targets) {
      if (contexts.has(t)) continue;
      contexts.set(t, null);
      api("GET", path + "/events?" + new URLSearchParams({ target: t, order: "desc", limit: "50" })).then((pg) => {
        const ev = pg.data.find((e) => e.context);
        if (ev) { contexts.set(t, ev); render(); }
      }, () => {});
    }
  };
  const report = (key) => (msg) => {
    if (msg) errors.set(key, msg); else errors.delete(key);
    render();
  };
  const render = () => {
    const pos = new Map(detail.preferences.map((p) => [p.id, p.index]));
    const h = history(known);
    const open = new Set(proposals.data.map((e) => e.id));
    // A preference names the assistant's latest proposal for it; the proposal is reviewed in
    // the list above, the one place of Apply and Dismiss.
    const itemProposals = new Map();
    for (const e of proposals.data) {
      if (e.target.type === "preference" && e.target.id && (!itemProposals.has(e.target.id) || itemProposals.get(e.target.id).id < e.id)) itemProposals.set(e.target.id, e);
    }
    // What waits for the user comes first: the proposals, oldest first, then the unconfirmed
    // items (and objective), each with what its write's event says of its turn.
    const unconfirmed = detail.preferences.filter((p) => p.source === "unconfirmed");
    const objectiveUnconfirmed = detail.objective && detail.objective.source === "unconfirmed";
    readContexts(unconfirmed.map((p) => "preference:" + p.id).concat(objectiveUnconfirmed ? ["objective"] : []));
    readAnswered();
    proposalSection.hidden = !proposals.data.length && !unconfirmed.length && !objectiveUnconfirmed;
    proposalList.replaceChildren(...proposals.data.map((e) => renderPending(e, pos, pending(e, h, pos, open), errors.get(e.id), report(e.id))),
      ...(objectiveUnconfirmed ? [renderUnconfirmedObjective(id, detail.objective, contexts.get("objective"), errors.get("unconfirmed:objective"), report("unconfirmed:objective"))] : []),
      ...unconfirmed.map((p) => renderUnconfirmed(id, p, contexts.get("preference:" + p.id), errors.get("unconfirmed:" + p.id), report("unconfirmed:" + p.id))));
    reviewBadge.hidden = detail.agent_writes !== "propose";
    if (document.activeElement !== titleInput) titleInput.value = detail.title || "";
    origin.textContent = [detail.first_words ? "It began with: " + quote(detail.first_words) : "", detail.agent ? "Agent: " + detail.agent : ""].filter((x) => x).join(" · ");
    origin.hidden = !origin.textContent;
    renderUsage(usage, detail.usage);
    renderScopes(id, detail, inheritedList, linked);
    if (document.activeElement !== parentsInput) parentsInput.value = (detail.parents || []).join(", ");
    writesSelect.replaceChildren(
      el("option", { value: "", selected: detail.agent_writes_inherited }, "as the parents say" + (detail.agent_writes_inherited ? " (now: " + detail.agent_writes + ")" : "")),
      el("option", { value: "direct", selected: !detail.agent_writes_inherited && detail.agent_writes === "direct" }, "direct: its changes count at once"),
      el("option", { value: "propose", selected: !detail.agent_writes_inherited && detail.agent_writes === "propose" }, "propose: you apply or dismiss each change"));
    writesNow.textContent = (detail.agent_writes === "propose" ? "Review mode is on" : "Review mode is off") +
      (detail.agent_writes_inherited ? ", inherited from the parents (or the default)." : ", set on this thread.");
    childList.replaceChildren(...children.map((c) => el("li", {}, el("a", { href: "#/t/" + encodeURIComponent(c.id), text: c.id }))));
    if (!children.length) childList.append(el("li", { class: "muted", text: "No thread names this one among its parents." }));
    const text = detail.objective ? detail.objective.text : "";
    objectiveText.textContent = text || "(none yet)";
    if (document.activeElement !== objectiveInput) objectiveInput.value = text;
    // A preference being edited keeps its form.
    const items = detail.preferences.map((p) => prefList.querySelector('li.editing[data-id="' + p.id + '"]') ||
      renderPreference(id, p, itemProposals.get(p.id), freshness("preference:" + p.id), errors.get("preference:" + p.id), report("preference:" + p.id), linked ? null : detail.parents || []));
    if (!items.length) items.push(el("li", { class: "muted", text: "No preferences yet." }));
    const focused = document.activeElement; // a form kept across the update keeps its focus
    prefList.replaceChildren(...items);
    if (focused !== document.activeElement && prefList.contains(focused)) focused.focus();

    const evs = [...known.values()].filter((e) => !state.target || targetKey(e.target) === state.target).sort((a, b) => b.id - a.id);
    const rows = evs.map((e) => renderEvent(e, pos, lookup, h, open, freshness(e.id), errors.get(e.id), report(e.id)));
    if (state.target) rows.unshift(el("li", {}, el("button", { type: "button", class: "quiet", onclick: () => state.showTarget(null) }, "Show all history")));
    if (!evs.length) rows.push(el("li", { class: "muted", text: "No changes yet." }));
    let head = "History";
    if (state.target === "objective") head = "History of the objective";
    else if (state.target) {
      const pid = Number(state.target.slice("preference:".length));
      const p = detail.preferences.find((q) => q.id === pid);
      head = "History of " + (p ? "#" + p.index + " " + quote(p.title) : "a removed preference");
    }
    timelineHead.textContent = head;
    timeline.replaceChildren(...rows);
  };
  let reads = 0; // only the latest read's answer is shown: an earlier one may come back later
  const refresh = () => act(async () => {
    const n = ++reads;
    const [d, ps] = await Promise.all([api("GET", path), api("GET", path + "/proposals?limit=500")]);
    if (n !== reads) return;
    detail = d;
    proposals = ps;
    render();
  }, (msg) => showIn(timelineBox, msg));
  const loadTimeline = () => act(async () => {
    const page = await api("GET", path + "/events?" + timelineQuery());
    for (const e of page.data) known.set(e.id, e);
    render();
  }, (msg) => showIn(timelineBox, msg));
  state.reload = () => { refresh(); loadTimeline(); };
  state.showTarget = (t) => {
    state.target = t;
    render();
    loadTimeline();
    if (getComputedStyle(jump).display !== "none") historySection.scrollIntoView();
  };
  state.describeEvent = (eventID) => {
    const e = known.get(eventID);
    return e ? describe(e, new Map(detail.preferences.map((p) => [p.id, p.index])), lookup) + " (" + whoText(e) + ", " + new Date(e.at).toLocaleString() + ")" : "";
  };
  for (const e of page.data) known.set(e.id, e);
  render();
  openStream(id, page.data.length ? page.data[0].id : 0, refresh, (e) => {
    refresh();
    if (known.has(e.id)) return;
    known.set(e.id, e);
    const now = Date.now();
    fresh.set(e.id, now);
    if (e.target.type === "preference") fresh.set("preference:" + e.target.id, now);
    setTimeout(render, FADE_MS + 100); // the highlight's end
    render();
    announce(describe(e, new Map(detail.preferences.map((p) => [p.id, p.index])), lookup));
  });
}

// fade highlights a live change, as far into its fade as it is old (a render draws it anew).
function fade(li, age) {
  if (age == null) return;
  li.classList.add("fresh");
  li.style.animationDelay = -age + "ms";
}

function renderPreference(thread, p, proposal, age, error, report, parents) {
  const path = threadPath(thread) + "/preferences/" + p.id;
  const patch = (body) => act(async () => { await api("PATCH", path, body); li.classList.remove("editing"); state.reload(); }, report);
  const li = el("li", { "data-id": String(p.id), class: "pref" });
  fade(li, age);
  const label = "#" + p.index + " " + p.title;
  const box = errorBox();
  showIn(box, error);
  const show = () => { li.classList.remove("editing"); li.replaceChildren(
    el("span", { class: "grow" }, el("span", { class: "title", text: "#" + p.index + " " + p.title }),
      p.subtitle ? el("span", { class: "subtitle", text: " — " + p.subtitle }) : null),
    ...badges(p),
    el("label", { class: "inline" }, "Kind", el("select", { "aria-label": "Kind of " + label, class: "kind", onchange: (ev) => patch({ kind: ev.target.value }) },
      el("option", { value: "soft", selected: p.kind === "soft" }, "soft"), el("option", { value: "hard", selected: p.kind === "hard" }, "hard"))),
    el("button", { type: "button", class: "quiet lock", "aria-label": (p.locked ? "Unlock " : "Lock ") + label, onclick: () => patch({ locked: !p.locked }) }, p.locked ? "Unlock" : "Lock"),
    el("button", { type: "button", class: "quiet edit", "aria-label": "Edit " + label, onclick: edit }, "Edit"),
    el("button", { type: "button", class: "quiet", "aria-label": "History of " + label, onclick: () => state.showTarget("preference:" + p.id) }, "History"),
    parents ? el("button", { type: "button", class: "quiet move", "aria-label": "Move " + label + " to another thread", onclick: move }, "Move to…") : null,
    el("button", { type: "button", class: "danger remove", "aria-label": "Remove " + label, onclick: () => act(async () => { await api("DELETE", path); state.reload(); }, report) }, "Remove"),
    ...(proposal ? [el("div", { class: "proposal" }, el("span", { text: "The assistant proposes a change to this item." }),
      toReview('#proposals li[data-event="' + proposal.id + '"]', "Review it"))] : []),
    box); };
  // move offers the thread's parents (another thread's name may be typed).
  function move() {
    li.classList.add("editing");
    const listID = "move-to-" + p.id;
    const to = el("input", { type: "text", value: parents[0] || "", list: listID, "aria-label": "Move " + label + " to", class: "move-to" });
    const moveBox = errorBox();
    const submit = () => act(async () => {
      await api("POST", path + "/move", { to: to.value.trim() });
      li.classList.remove("editing");
      state.reload();
    }, (msg) => showIn(moveBox, msg));
    li.replaceChildren(el("form", { class: "move-form", onsubmit: (ev) => { ev.preventDefault(); submit(); } },
      el("span", { class: "title", text: label }), to, el("datalist", { id: listID }, ...parents.map((name) => el("option", { value: name }))),
      el("button", { type: "submit" }, "Move"), el("button", { type: "button", class: "quiet", onclick: show }, "Cancel")), moveBox);
    to.focus();
    to.select();
  }
  function edit() {
    li.classList.add("editing");
    const t = el("input", { type: "text", value: p.title, id: "edit-title-" + p.id, class: "edit-title" });
    const s = el("input", { type: "text", value: p.subtitle, id: "edit-subtitle-" + p.id, class: "edit-subtitle" });
    const editBox = errorBox();
    const save = () => act(async () => { await api("PATCH", path, { title: t.value, subtitle: s.value }); li.classList.remove("editing"); state.reload(); },
      (msg) => showIn(editBox, msg));
    li.replaceChildren(el("form", { onsubmit: (ev) => { ev.preventDefault(); save(); } },
      el("label", { for: t.id }, "Title of #" + p.index, t), el("label", { for: s.id }, "Subtitle of #" + p.index, s),
      el("button", { type: "submit" }, "Save"), el("button", { type: "button", class: "quiet", onclick: show }, "Cancel")), editBox);
    t.focus();
  }
  show();
  return li;
}

// badges are a preference's kind, and "locked" and "unconfirmed" beside it when it is.
function badges(p) {
  const out = [el("span", { class: "badge kind", text: p.kind })];
  if (p.locked) out.push(el("span", { class: "badge locked", text: "locked" }));
  if (p.source === "unconfirmed") out.push(el("span", { class: "badge unconfirmed", text: "unconfirmed" }));
  return out;
}

// renderUsage shows the thread's token counts (tools.Usage; a thread without turns has none).
function renderUsage(box, u) {
  u = u || {};
  box.replaceChildren(...[["Prompt", u.prompt_tokens], ["Cached", u.cached_prompt_tokens], ["Completion", u.completion_tokens], ["Cache writes", u.cache_write_tokens]]
    .map(([name, n]) => el("div", { class: "stat" }, el("dt", { text: name }), el("dd", { text: (n || 0).toLocaleString("en-US") }))));
}

// renderScopes shows what the parents give, nearest first, read-only, each scope's heading a link
// to its page (a link's holder opens its one thread only: no link then; a scope the admin shared,
// ~name, is the admin's page: no link for a client, docs/spec.md §20).
function renderScopes(thread, d, box, linked) {
  const items = [];
  for (const s of d.inherited || []) {
    const shared = s.scope.startsWith("~");
    const route = "#/t/" + encodeURIComponent(shared ? s.scope.slice(1) : d.client ? d.client + "~" + s.scope : s.scope);
    items.push(el("h3", { class: "scope" }, "From ", linked || (shared && state.scope !== "admin") ? el("span", { class: "scope-name", text: s.scope }) : el("a", { href: route, class: "scope-name", text: s.scope })),
      el("ul", { class: "prefs inherited", "data-scope": s.scope }, ...s.preferences.map((p) => el("li", { class: "inherited-pref" },
        el("span", { class: "grow" }, el("span", { class: "title", text: p.title }), p.subtitle ? el("span", { class: "subtitle", text: " — " + p.subtitle }) : null),
        ...badges(p)))));
  }
  if (!items.length) {
    items.push(el("p", { class: "muted", text: (d.parents || []).length
      ? "The parents give nothing this thread does not hold already."
      : "No parents: this thread inherits nothing." }));
  }
  box.replaceChildren(...items);
}

// renderPending is one proposal waiting for the user, the one place it is applied or dismissed
// (docs/spec.md §19): why it waits first (the words of the user's it does not hold), what it
// would change in full, what its turn had read, the assistant's reason; Apply (while it still
// applies) and Dismiss.
function renderPending(e, pos, applies, error, report) {
  const what = proposalText(e, pos);
  const box = errorBox();
  showIn(box, error);
  return el("li", { class: "pending", "data-event": String(e.id), "data-kind": e.kind, tabindex: "-1" },
    el("div", { class: "meta", text: new Date(e.at).toLocaleString() + " · " + whoText(e) }),
    whyNode(e.context),
    el("div", { class: "what", text: "The assistant proposes: " + what }),
    fullNode(e),
    taintNode(e.context),
    e.reason ? el("blockquote", { class: "reason", text: e.reason }) : null,
    el("div", { class: "actions" },
      applies ? applyButton(e.thread, e, "Apply: " + what, report) : el("span", { class: "muted", text: "Its target changed since: it no longer applies." }),
      dismissButton(e.thread, e, "Dismiss: " + what, report)),
    box);
}

// renderUnconfirmed is an item applied from content the user did not write (untrusted_writes
// apply), in the same place as the proposals: its text in full, why it is unconfirmed and what
// its turn had read (its write's event, ev, once read), Confirm (it reads as it is) and Remove.
function renderUnconfirmed(thread, p, ev, error, report) {
  const box = errorBox();
  showIn(box, error);
  const path = threadPath(thread) + "/preferences/" + p.id;
  const label = "#" + p.index + " " + p.title;
  return el("li", { class: "pending unconfirmed", "data-pref": String(p.id), tabindex: "-1" },
    ev ? el("div", { class: "meta", text: new Date(ev.at).toLocaleString() + " · " + whoText(ev) }) : null,
    whyNode(ev && ev.context),
    el("div", { class: "what", text: "Unconfirmed: #" + p.index + " " + fieldsText(p) }),
    el("p", { class: "full", text: "The assistant wrote it from content you did not write; the assistant is told it is information, not your wish, until you confirm it." }),
    taintNode(ev && ev.context),
    ev && ev.reason ? el("blockquote", { class: "reason", text: ev.reason }) : null,
    el("div", { class: "actions" },
      el("button", { type: "button", class: "apply confirm-item", "aria-label": "Confirm: " + label, onclick: () => act(async () => {
        await api("PATCH", path, { source: "confirmed" });
        state.reload();
      }, report) }, "Confirm"),
      el("button", { type: "button", class: "quiet dismiss", "aria-label": "Remove: " + label, onclick: () => act(async () => {
        await api("DELETE", path);
        state.reload();
      }, report) }, "Remove")),
    box);
}

// renderUnconfirmedObjective is an unconfirmed objective: Confirm makes it the user's as it reads.
function renderUnconfirmedObjective(thread, o, ev, error, report) {
  const box = errorBox();
  showIn(box, error);
  return el("li", { class: "pending unconfirmed", "data-objective": "", tabindex: "-1" },
    whyNode(ev && ev.context),
    el("div", { class: "what", text: "Unconfirmed objective: " + quote(o.text) }),
    taintNode(ev && ev.context),
    ev && ev.reason ? el("blockquote", { class: "reason", text: ev.reason }) : null,
    el("div", { class: "actions" },
      el("button", { type: "button", class: "apply confirm-item", "aria-label": "Confirm the objective", onclick: () => act(async () => {
        await api("PUT", threadPath(thread) + "/objective", { text: o.text });
        state.reload();
      }, report) }, "Confirm")),
    box);
}

// RULES says in words why a write was not grounded (docs/spec.md §19, context.rule) when no
// token of its own failed.
const RULES = {
  mcp: "it came over MCP, where wsproxy cannot see what the assistant read",
  after_ungrounded: "an earlier change of the same turn was not in your words",
  inherited_by: "other threads inherit this workspace",
  users_item: "it changes an item you wrote or confirmed",
  words: "its words are not in your last two messages",
  naming: "your last message does not name the item",
};

// whyNode is why a write of a tainted turn waits, first: the words it writes that the user's
// last two messages do not hold (as code: they are the model's), else its rule. A turn that was
// not tainted proposes only in review mode, whatever its words: nothing to say then.
function whyNode(ctx) {
  if (!ctx || !ctx.tainted || ctx.grounded) return null;
  const words = ctx.ungrounded || [];
  if (words.length) {
    return el("p", { class: "ungrounded" }, "Not in your words: ", ...words.flatMap((w, i) => [i ? ", " : null, el("code", { text: w })].filter((n) => n != null)));
  }
  return RULES[ctx.rule] ? el("p", { class: "ungrounded", text: "Not from your words: " + RULES[ctx.rule] + "." }) : null;
}

// sourceNodes is one kind of untrusted content a turn read, in words; a tool's name is code,
// never a link.
function sourceNodes(s) {
  const code = (t) => el("code", { text: t });
  switch (s.type) {
    case "tool_result": return s.tool ? ["the result of ", code(s.tool)] : ["a tool's result"];
    case "server_tool": return s.tool ? ["the result of the server tool ", code(s.tool)] : ["a server tool's result"];
    case "file": return ["a file"];
    case "image": return ["an image"];
    case "client_text": return ["text the client added to your message"];
    case "system": return ["a later system message"];
    case "server_held": return ["content the request only named"];
    case "mcp": return ["what an agent over MCP read"];
    case "earlier_turn": return ["content an earlier turn of this thread read"];
  }
  return ["content of the kind ", code(s.type)];
}

// taintNode says what tainted the write's turn: the untrusted part nearest before the write, then
// the other kinds it read ("This turn had read the result of `WebFetch`.").
function taintNode(ctx) {
  if (!ctx || !ctx.tainted) return null;
  const sources = ctx.sources || [];
  const first = ctx.nearest || sources[0];
  const same = (a, b) => a.type === b.type && (a.tool || "") === (b.tool || "");
  const others = sources.filter((s) => !first || !same(s, first));
  const nodes = ["This turn had read "];
  nodes.push(...(first ? sourceNodes(first) : ["content you did not write"]));
  others.forEach((s, i) => nodes.push(i ? ", " : "; also ", ...sourceNodes(s)));
  nodes.push(".");
  return el("p", { class: "tainted" }, ...nodes);
}

// fullNode is what a proposal would change, in full: the target as it is, and as it would be.
function fullNode(e) {
  const rows = [];
  const row = (label, text) => rows.push(el("div", {}, el("span", { class: "label", text: label + " " }), el("span", { text })));
  if (e.target.type === "objective") {
    row("Now:", e.before && e.before.text ? quote(e.before.text) : "(none)");
    row("Would be:", quote(e.proposed.text));
  } else if (!e.target.id) {
    row("Would add:", fieldsText(e.proposed));
  } else if (e.proposed === null) {
    if (e.before) row("Would remove:", fieldsText(e.before));
  } else {
    if (e.before) row("Now:", fieldsText(e.before));
    row("Would be:", fieldsText(e.proposed));
  }
  return el("div", { class: "full" }, ...rows);
}

// toReview is the way from an item or a history entry to its proposal: Apply and Dismiss live
// in the review list only.
function toReview(selector, text) {
  return el("button", { type: "button", class: "quiet to-review", onclick: () => {
    const li = document.querySelector(selector);
    if (li) { li.scrollIntoView(); li.focus(); }
  } }, text);
}

function dismissButton(thread, e, ariaLabel, report) {
  return el("button", { type: "button", class: "quiet dismiss", "aria-label": ariaLabel, onclick: () => act(async () => {
    await api("POST", threadPath(thread) + "/events/" + e.id + "/dismiss");
    state.reload();
  }, report) }, "Dismiss");
}

function applyButton(thread, e, ariaLabel, report) {
  return el("button", { type: "button", class: "apply", "aria-label": ariaLabel, onclick: () => act(async () => {
    await api("POST", threadPath(thread) + "/events/" + e.id + "/apply");
    state.reload();
  }, (msg) => report(msg && conflictText(msg))) }, "Apply");
}

// conflictText says which later change stands in the way of a revert or an apply (the server's
// message names it by its id: a revert's the latest in its way, which can be reverted now).
function conflictText(msg) {
  if (msg.startsWith("the preference changed after this proposal")) {
    const m = /\(event (\d+)\)/.exec(msg);
    const later = m && state.describeEvent ? state.describeEvent(Number(m[1])) : "";
    return later ? "This preference changed since the assistant's proposal: " + later + "." : msg;
  }
  const id = conflictLatest(msg);
  const later = id && state.describeEvent ? state.describeEvent(id) : "";
  if (!later) return msg;
  return "This changed again since. The latest change: " + later + ". Revert that change first, or undo back to this one in one step.";
}

// conflictLatest is the id of the latest change in a revert's way, from the server's 409
// message; 0 for another message.
function conflictLatest(msg) {
  const m = /\(latest: event (\d+)\)/.exec(msg || "");
  return m ? Number(m[1]) : 0;
}

// reasonOf is the assistant's reason of a change: its own, or that of the proposal it applied.
function reasonOf(e, known) {
  const p = appliedProposal(e, known);
  return e.reason || (p && p.reason) || "";
}

function renderEvent(e, pos, known, h, open, age, error, report) {
  const reverted = h.revertedBy.get(e.id);
  const li = el("li", { class: "event" + (reverted ? " reverted" : ""), "data-kind": e.kind, "data-event": String(e.id), "data-via": e.via },
    el("div", { class: "meta", text: new Date(e.at).toLocaleString() + " · " + whoText(e) }),
    el("div", { class: "what", text: describe(e, pos, known) }),
    reasonOf(e, known) ? el("blockquote", { class: "reason", text: reasonOf(e, known) }) : null);
  fade(li, age);
  const label = describe(e, pos, known);
  if (reverted) {
    li.append(el("div", { class: "reverted-by", text: "Reverted by " + whoText(reverted) + ", " + new Date(reverted.at).toLocaleString() }));
  } else if (UNDONE.has(e.kind)) {
    if (open.has(e.id)) li.append(toReview('#proposals li[data-event="' + e.id + '"]', "Waiting for your review"));
  } else if (!SETTINGS.has(e.kind)) {
    li.append(el("button", { type: "button", class: "quiet revert", "aria-label": "Revert: " + label, onclick: () => act(async () => {
      await api("POST", threadPath(e.thread) + "/events/" + e.id + "/revert");
      state.reload();
    }, report) }, "Revert"));
  }
  const box = errorBox();
  showIn(box, error && conflictText(error));
  li.append(box);
  // A revert in the way of later changes offers them all undone, newest first, then this one: in
  // one step (the server's ?through, each step a revert event), through the latest change the
  // message named, so one made since is never undone unseen.
  const latest = !reverted && conflictLatest(error);
  if (latest) {
    li.append(el("button", { type: "button", class: "revert-through", "aria-label": "Undo back to: " + label, onclick: () => act(async () => {
      await api("POST", threadPath(e.thread) + "/events/" + e.id + "/revert?through=" + latest);
      state.reload();
    }, report) }, "Undo back to this change"));
  }
  return li;
}

// timelineQuery is the query of the timeline's read: the newest events first, of the target
// shown.
function timelineQuery() {
  const q = new URLSearchParams({ order: "desc", limit: "200" });
  if (state.target) q.set("target", state.target);
  return q;
}

// openStream opens the thread's live stream after the event after (a reconnect resumes after
// the last event it brought: EventSource's Last-Event-ID). A change in one of the thread's scopes
// comes as an event named "scope" (no id): onScope reads the workspace again. Other names are
// ignored.
function openStream(id, after, onScope, onEvent) {
  const src = new EventSource(threadPath(id) + "/events/stream?after=" + after);
  src.addEventListener("scope", () => onScope());
  src.onmessage = (m) => { try { onEvent(JSON.parse(m.data)); } catch (e) { showIn(document.getElementById("error"), "a live update was not understood"); } };
  state.stream = src;
}

// closeStream ends what keeps a page live: its event stream, the Clients page's usage reads.
function closeStream() {
  if (state.stream) state.stream.close();
  state.stream = null;
  clearInterval(state.poll);
  state.poll = null;
  state.describeEvent = null;
}

start();
