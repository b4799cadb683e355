// The agentloop console. Everything it shows and does goes through the public
// HTTP/JSON API (/v1/...), with the signed-in token in the Authorization header.
// The page is built from text nodes only: nothing a model or a tool wrote is ever
// parsed as HTML.
'use strict';

const TOKEN_KEY = 'agentloop.token';
const ACTOR_KEY = 'agentloop.actor';
const LIST_REFRESH_MS = 2000;
const STATS_REFRESH_MS = 5000;
const RECONNECT_MS = 1000;
// Reconnections of a timeline's event stream in a row, without an event, before it stops.
const MAX_RECONNECTS = 30;
// Most invocations the effects page checks for entries needing an operator.
const EFFECTS_SCAN = 50;

const REASONS = [
  'COMPLETED', 'APPROVAL_REQUIRED', 'CLARIFICATION_REQUIRED', 'CANCELLED',
  'DEADLINE_EXCEEDED', 'MAX_STEPS', 'TOOL_BUDGET_EXHAUSTED', 'TOKEN_BUDGET_EXHAUSTED',
  'NO_PROGRESS', 'INVALID_DECISION', 'MODEL_ERROR', 'CHECKPOINT_FAILED',
  'CANNOT_CONTINUE', 'VERIFICATION_FAILED', 'RECONCILIATION_REQUIRED',
];

// ---- the API ---------------------------------------------------------------------

/** An error the API answered: its google.rpc.Status code name and message. */
class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

function headers(json) {
  const h = { 'Accept': 'application/json' };
  if (json) h['Content-Type'] = 'application/json';
  const t = token();
  if (t) h['Authorization'] = 'Bearer ' + t;
  return h;
}

async function failure(response) {
  let code = 'UNKNOWN';
  let message = response.status + ' ' + response.statusText;
  try {
    const body = await response.json();
    if (body && typeof body.message === 'string') message = body.message;
    if (body && body.code !== undefined) code = codeName(body.code);
  } catch (_) { /* not JSON: keep the HTTP status */ }
  return new ApiError(response.status, code, message);
}

const CODES = ['OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED',
  'NOT_FOUND', 'ALREADY_EXISTS', 'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED',
  'FAILED_PRECONDITION', 'ABORTED', 'OUT_OF_RANGE', 'UNIMPLEMENTED', 'INTERNAL',
  'UNAVAILABLE', 'DATA_LOSS', 'UNAUTHENTICATED'];

function codeName(code) {
  return typeof code === 'number' ? (CODES[code] || String(code)) : String(code);
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'omit',
    cache: 'no-store',
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

function query(params) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') q.append(name, String(value));
  }
  const text = q.toString();
  return text ? '?' + text : '';
}

/**
 * Follows an invocation's events (Server-Sent Events over fetch, so that the token
 * goes in a header), calling onEvent for each; reconnects from the last seq seen
 * until the stream ends by itself or stop() is called.
 */
function follow(id, onEvent, onError) {
  const controller = new AbortController();
  let next = 1;
  let stopped = false;
  async function once() {
    const response = await fetch('/v1/invocations/' + encodeURIComponent(id) + '/events' +
      query({ fromSeq: next }), { headers: headers(false), signal: controller.signal, cache: 'no-store' });
    if (!response.ok) throw await failure(response);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let kind = 'message';
        let data = '';
        for (const line of block.split('\n')) {
          if (line.startsWith('event: ')) kind = line.slice(7);
          else if (line.startsWith('data: ')) data += line.slice(6);
        }
        const parsed = JSON.parse(data);
        if (kind === 'error') throw new ApiError(0, codeName(parsed.code), parsed.message || 'the stream failed');
        if (parsed.event) {
          next = Number(parsed.event.seq) + 1;
          onEvent(parsed.event);
        }
      }
    }
  }
  (async () => {
    let failures = 0;
    let seen = next;
    while (!stopped) {
      try {
        await once();
        return; // the invocation ended: the server closed the stream
      } catch (error) {
        if (stopped || error.name === 'AbortError') return;
        onError(error);
        if (error instanceof ApiError && error.status >= 400 && error.status < 500) return;
        // Consecutive failures without a new event are bounded; then the page says so.
        failures = next > seen ? 1 : failures + 1;
        seen = next;
        if (failures > MAX_RECONNECTS) {
          onError(new Error('the event stream keeps failing: reload the page to try again'));
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
      }
    }
  })();
  return () => { stopped = true; controller.abort(); };
}

// ---- building the page -------------------------------------------------------------

/** An element with attributes and children; strings become text nodes. */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else if (name === 'dataset') Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function notice(message) {
  const box = document.getElementById('notice');
  box.textContent = message || '';
  box.hidden = !message;
}

function explain(error) {
  if (error instanceof ApiError && error.code === 'UNAUTHENTICATED') {
    return 'Sign in: ' + error.message;
  }
  if (error instanceof ApiError) return error.code + ': ' + error.message;
  return String(error && error.message ? error.message : error);
}

function short(name, prefix) {
  return name ? String(name).replace(prefix, '').toLowerCase() : '';
}

const reasonName = (r) => short(r, 'TERMINAL_REASON_');
const stateName = (s) => short(s, 'INVOCATION_STATE_') || 'pending';
const effectName = (s) => short(s, 'EFFECT_STATE_');

function when(timestamp) {
  if (!timestamp) return '';
  const at = new Date(timestamp);
  return isNaN(at) ? String(timestamp) : at.toLocaleString();
}

function pretty(jsonText) {
  if (jsonText === undefined || jsonText === '') return '';
  try {
    return JSON.stringify(JSON.parse(jsonText), null, 2);
  } catch (_) {
    return String(jsonText);
  }
}

function usd(micro) {
  const n = Number(micro || 0);
  return '$' + (n / 1e6).toFixed(n >= 1e4 ? 2 : 6);
}

function code(text) {
  return el('pre', { class: 'code' }, el('code', {}, text));
}

function field(label, input) {
  const id = 'f-' + Math.random().toString(36).slice(2);
  input.id = id;
  return el('div', { class: 'field' }, el('label', { for: id }, label), input);
}

function table(caption, columns, rows) {
  return el('table', {},
    el('caption', {}, caption),
    el('thead', {}, el('tr', {}, columns.map((c) => el('th', { scope: 'col' }, c)))),
    el('tbody', {}, rows));
}

/** A button that runs an action once at a time and reports its failure. */
function action(label, run, attrs) {
  const button = el('button', Object.assign({ type: 'button' }, attrs || {}), label);
  button.addEventListener('click', async () => {
    button.disabled = true;
    notice('');
    try {
      await run();
    } catch (error) {
      notice(explain(error));
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

function actor() {
  // With a token the server takes the caller from it, and another name is refused.
  return token() ? '' : (sessionStorage.getItem(ACTOR_KEY) || 'console');
}

// ---- pages -------------------------------------------------------------------------

let leave = () => {};

/** Runs `load` now and every `ms` until the page is left; not while the tab is hidden. */
function every(ms, load) {
  let timer = null;
  let gone = false;
  async function tick() {
    if (!document.hidden) {
      try {
        await load();
      } catch (error) {
        notice(explain(error));
      }
    }
    if (!gone) timer = setTimeout(tick, ms);
  }
  tick();
  return () => { gone = true; clearTimeout(timer); };
}

function localInput(value) {
  return el('input', { type: 'datetime-local', value: value || '' });
}

function instant(local) {
  if (!local) return '';
  const at = new Date(local);
  return isNaN(at) ? '' : at.toISOString();
}

const filters = { state: '', reason: '', tenant: '', after: '', before: '', pageToken: '' };

function invocationsPage(root) {
  const state = el('select', {},
    el('option', { value: '' }, 'any'),
    ['RUNNING', 'WAITING', 'ENDED'].map((s) =>
      el('option', { value: 'INVOCATION_STATE_' + s }, s.toLowerCase())));
  const reason = el('select', {},
    el('option', { value: '' }, 'any'),
    REASONS.map((r) => el('option', { value: 'TERMINAL_REASON_' + r }, r.toLowerCase())));
  const tenant = el('input', { type: 'text', spellcheck: 'false' });
  const after = localInput(filters.after);
  const before = localInput(filters.before);
  state.value = filters.state;
  reason.value = filters.reason;
  tenant.value = filters.tenant;
  const body = el('tbody', {});
  const more = el('p', {});
  const form = el('form', { class: 'filters', 'aria-label': 'Filters' },
    field('State', state), field('Terminal reason', reason), field('Tenant', tenant),
    field('Created after', after), field('Created before', before),
    el('button', { type: 'submit' }, 'Apply'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    Object.assign(filters, {
      state: state.value, reason: reason.value, tenant: tenant.value.trim(),
      after: after.value, before: before.value, pageToken: '',
    });
    refresh();
  });
  append(root, [
    el('h1', {}, 'Invocations'),
    form,
    el('table', { id: 'invocations' },
      el('caption', {}, 'Newest first; refreshed every few seconds'),
      el('thead', {}, el('tr', {},
        ['Invocation', 'Goal', 'State', 'Reason', 'Tenant', 'Actor', 'Turns', 'Calls', 'Created']
          .map((c) => el('th', { scope: 'col' }, c)))),
      body),
    more,
  ]);
  async function refresh() {
    const page = await api('GET', '/v1/invocations' + query({
      pageSize: 50,
      pageToken: filters.pageToken,
      state: filters.state,
      terminalReason: filters.reason,
      tenant: filters.tenant,
      createdAfter: instant(filters.after),
      createdBefore: instant(filters.before),
    }));
    clear(body);
    for (const inv of page.invocations || []) {
      const usage = inv.usage || {};
      body.append(el('tr', { dataset: { id: inv.invocationId } },
        el('td', {}, el('a', { href: '#/invocations/' + inv.invocationId, class: 'id' }, inv.invocationId)),
        el('td', { class: 'goal' }, inv.goal || ''),
        el('td', {}, stateName(inv.state)),
        el('td', {}, reasonName(inv.terminalReason)),
        el('td', {}, inv.tenant || ''),
        el('td', {}, inv.actor || ''),
        el('td', { class: 'n' }, usage.steps || 0),
        el('td', { class: 'n' }, usage.toolCalls || 0),
        el('td', {}, when(inv.createdAt))));
    }
    if (!(page.invocations || []).length) {
      body.append(el('tr', {}, el('td', { colspan: 9 }, 'No invocations match.')));
    }
    clear(more);
    if (filters.pageToken) {
      more.append(action('First page', async () => { filters.pageToken = ''; await refresh(); }));
    }
    if (page.nextPageToken) {
      more.append(action('Next page', async () => { filters.pageToken = page.nextPageToken; await refresh(); }));
    }
  }
  return every(LIST_REFRESH_MS, refresh);
}

function summary(inv) {
  const usage = inv.usage || {};
  const budget = inv.budget || {};
  const rows = [
    ['State', stateName(inv.state)],
    ['Terminal reason', reasonName(inv.terminalReason)],
    ['Detail', inv.terminalDetail || ''],
    ['Answer', inv.answer === undefined ? '' : inv.answer],
    ['Goal', inv.goal || ''],
    ['Tenant', inv.tenant || 'none'],
    ['Actor', inv.actor || 'none'],
    ['Profile', inv.profile || 'default'],
    ['Turns', (usage.steps || 0) + (budget.maxSteps ? ' of ' + budget.maxSteps : '')],
    ['Tool calls', (usage.toolCalls || 0) + (budget.maxToolCalls ? ' of ' + budget.maxToolCalls : '')],
    ['Tokens in / out', (usage.inputTokens || 0) + ' / ' + (usage.outputTokens || 0)],
    ['Cost', usd(usage.costMicroUsd)],
    ['Created', when(inv.createdAt)],
    ['Updated', when(inv.updatedAt)],
  ];
  return el('dl', { class: 'summary' },
    rows.filter(([, v]) => v !== '').map(([k, v]) => [el('dt', {}, k), el('dd', {}, String(v))]));
}

function callsList(calls, results, effects, permits) {
  return el('ol', { class: 'calls' }, (calls || []).map((call) => {
    const result = results ? results.get(call.callId) : undefined;
    const effect = effects ? effects.get(call.callId) : undefined;
    const permit = permits ? permits.get(call.callId) : undefined;
    return el('li', { class: 'call', dataset: { call: call.callId } },
      el('div', {}, el('strong', {}, call.tool), ' ', el('span', { class: 'muted' }, 'call ' + call.callId)),
      permit ? el('p', { class: 'permit' }, 'permitted by ' + (permit.length ? permit.join(', ') : 'no named policy')) : null,
      code(pretty(call.argumentsJson)),
      result ? resultView(result) : null,
      effect ? el('p', { class: 'effect' }, 'effect ', el('code', {}, effect.effectKey),
        ': ', el('span', { class: 'state' }, effectName(effect.state)),
        effect.receipt ? ', receipt ' + effect.receipt : '',
        effect.detail ? ' (' + effect.detail + ')' : '') : null);
  }));
}

function resultView(result) {
  if (result.output) {
    return el('div', { class: 'result ok' }, el('span', {}, 'output'),
      result.output.receipt ? ' (receipt ' + result.output.receipt + ')' : '',
      code(pretty(result.output.outputJson)));
  }
  if (result.error) {
    const e = result.error;
    return el('div', { class: 'result bad' },
      'error ' + short(e.errorType, 'ERROR_TYPE_') + ': ', el('span', {}, e.message || ''),
      e.retryable ? ' (retryable)' : '',
      e.nextAllowedAction ? ' next: ' + short(e.nextAllowedAction, 'NEXT_ACTION_') : '');
  }
  if (result.cancelled) return el('div', { class: 'result bad' }, 'cancelled: ' + (result.cancelled.reason || ''));
  if (result.notStarted) return el('div', { class: 'result' }, 'not started: ' + (result.notStarted.reason || ''));
  if (result.unknown) return el('div', { class: 'result bad' }, 'outcome unknown: ' + (result.unknown.detail || ''));
  if (result.inputRequired) return el('div', { class: 'result' }, 'asked a person: ' + (result.inputRequired.message || ''));
  return el('div', { class: 'result' }, 'no outcome');
}

function checksView(checks) {
  if (!checks || !checks.length) return null;
  return el('ul', { class: 'checks' }, checks.map((c) => el('li', {},
    el('strong', {}, c.name || ''), ' ', short(c.kind, 'CHECK_KIND_'), ': ',
    el('span', { class: 'verdict' }, short(c.verdict, 'CHECK_VERDICT_')),
    (c.reasons || []).length ? ' (' + c.reasons.join('; ') + ')' : '',
    (c.evidence || []).length ? ' evidence ' + c.evidence.join(', ') : '')));
}

function decisionView(decision, results, effects, permits) {
  const d = decision || {};
  if (d.final) {
    return [el('p', {}, 'Final answer:'), code(d.final.answer || ''),
      (d.final.evidence || []).length ? el('p', {}, 'Evidence: ' + d.final.evidence.join(', ')) : null];
  }
  if (d.toolCalls) return [el('p', {}, 'Tool calls:'), callsList(d.toolCalls.calls, results, effects, permits)];
  if (d.requestApproval) {
    return [el('p', {}, 'Asks approval: ', d.requestApproval.summary || ''),
      callsList(d.requestApproval.calls, results, effects, permits)];
  }
  if (d.clarification) return [el('p', {}, 'Asks: ', d.clarification.question || '')];
  if (d.cannotContinue) return [el('p', {}, 'Cannot continue: ', d.cannotContinue.reason || '')];
  return [el('p', {}, 'No decision')];
}

function eventView(event, effects) {
  const head = (title) => el('h3', {}, el('span', { class: 'seq' }, '#' + event.seq), ' ', title,
    ' ', el('time', { class: 'muted' }, when(event.committedAt)));
  if (event.turn || event.batchStarted) {
    const t = event.turn || event.batchStarted;
    const results = new Map((t.results || []).map((r) => [r.callId, r]));
    const permits = new Map((t.permits || []).map((p) => [p.callId, p.policyIds || []]));
    const usage = t.usage || {};
    const rejection = t.rejection;
    return el('li', { class: 'event turn' },
      head('Turn ' + (t.turn || 0) + (event.batchStarted ? ': its writes are about to run' : '')),
      decisionView(t.decision, results, effects, permits),
      rejection ? el('div', { class: 'rejection' },
        el('p', {}, 'Refused (' + short(rejection.kind, 'REJECTION_KIND_') + '): ', rejection.message || ''),
        el('ul', {}, (rejection.refusals || []).map((r) => el('li', {},
          'call ' + r.callId + ', ' + short(r.errorType, 'ERROR_TYPE_') + ': ', r.message || '',
          (r.policyIds || []).length ? ' policies: ' + r.policyIds.join(', ') : '')))) : null,
      checksView(t.checks),
      el('p', { class: 'muted' },
        'tokens ' + (usage.inputTokens || 0) + ' in, ' + (usage.outputTokens || 0) + ' out',
        usage.costMicroUsd !== undefined ? ', ' + usd(usage.costMicroUsd) : '',
        t.policyVersion ? ', policy ' + t.policyVersion : ''));
  }
  if (event.ended) {
    const e = event.ended;
    const waits = Boolean(e.waitUntil);
    return el('li', { class: 'event ended' },
      head(waits ? 'Waits: ' + reasonName(e.reason) : 'Ended: ' + reasonName(e.reason)),
      e.detail ? el('p', {}, e.detail) : null,
      e.answer !== undefined ? code(e.answer) : null,
      waits ? el('p', { class: 'muted' }, 'until ' + when(e.waitUntil)) : null,
      e.proposalDigest ? el('p', { class: 'muted' }, 'proposal ', el('code', {}, e.proposalDigest)) : null,
      checksView(e.acceptedBy));
  }
  if (event.approvalResolved) {
    const a = event.approvalResolved;
    return el('li', { class: 'event reply' },
      head((a.verdict === 'APPROVAL_VERDICT_APPROVE' ? 'Approved' : 'Denied') + ' by ' + (a.actor || 'no one named')),
      a.comment ? el('p', {}, a.comment) : null,
      a.waited ? el('p', { class: 'muted' }, 'after ' + a.waited) : null);
  }
  if (event.clarificationAnswered) {
    const c = event.clarificationAnswered;
    const did = { INPUT_ACTION_ACCEPT: 'Accepted', INPUT_ACTION_DECLINE: 'Declined', INPUT_ACTION_CANCEL: 'Cancelled' }[c.action];
    return el('li', { class: 'event reply' },
      head((did ? did + " a tool's question" : 'Answered') + ' by ' + (c.actor || 'no one named')),
      c.answer ? code(did ? pretty(c.answer) : c.answer) : null,
      c.waited ? el('p', { class: 'muted' }, 'after ' + c.waited) : null);
  }
  return el('li', { class: 'event' }, head('An event this console does not know'));
}

function invocationPage(root, id) {
  const title = el('h1', {}, 'Invocation ', el('code', {}, id));
  const top = el('section', { 'aria-label': 'Summary' });
  const waiting = el('section', { 'aria-label': 'Waiting for' });
  const timeline = el('ol', { class: 'timeline', 'aria-live': 'polite' });
  append(root, [title, top, waiting, el('h2', {}, 'Timeline'), timeline]);
  const effects = new Map();
  const events = [];
  let gone = false;
  async function loadEffects() {
    let pageToken = '';
    do {
      const page = await api('GET', '/v1/invocations/' + encodeURIComponent(id) + '/effects' + query({ pageToken }));
      for (const entry of page.entries || []) effects.set(entry.callId, entry);
      pageToken = page.nextPageToken || '';
    } while (pageToken && !gone);
  }
  function render() {
    clear(timeline);
    for (const event of events) timeline.append(eventView(event, effects));
  }
  async function load() {
    const inv = (await api('GET', '/v1/invocations/' + encodeURIComponent(id))).invocation;
    clear(top);
    top.append(summary(inv));
    if (inv.state !== 'INVOCATION_STATE_ENDED') {
      top.append(action('Cancel', async () => {
        await api('POST', '/v1/invocations/' + encodeURIComponent(id) + ':cancel', { reason: 'cancelled from the console' });
        await load();
      }));
    }
    clear(waiting);
    if (inv.state === 'INVOCATION_STATE_WAITING') waiting.append(replyForm(inv, load));
    return inv;
  }
  let refreshing = false;
  let again = false;
  function refresh() {
    // One refresh at a time; events that arrive meanwhile ask for one more after it.
    if (refreshing) { again = true; return; }
    refreshing = true;
    Promise.all([load(), loadEffects()])
      .then(render)
      .catch((error) => notice(explain(error)))
      .finally(() => {
        refreshing = false;
        if (again && !gone) { again = false; refresh(); }
      });
  }
  load().catch((error) => notice(explain(error)));
  const stop = follow(id, (event) => {
    events.push(event);
    timeline.append(eventView(event, effects));
    refresh();
  }, (error) => notice(explain(error)));
  return () => { gone = true; stop(); };
}

/** What a waiting invocation needs: the approval form or the answer form. */
function replyForm(inv, done) {
  const id = inv.invocationId;
  const approval = inv.pendingApproval;
  if (approval && approval.proposalDigest) {
    const comment = el('textarea', { rows: 2 });
    const resolve = (verdict) => async () => {
      await api('POST', '/v1/invocations/' + encodeURIComponent(id) + ':resolveApproval', {
        proposalDigest: approval.proposalDigest,
        verdict,
        comment: comment.value,
        actor: actor(),
      });
      await done();
    };
    return el('div', { class: 'wait approval', dataset: { id } },
      el('h2', {}, 'Approval'),
      el('p', {}, approval.summary || ''),
      el('p', { class: 'muted' }, 'Proposal digest ', el('code', {}, approval.proposalDigest),
        ': the approval covers exactly these calls.'),
      callsList(approval.calls),
      field('Comment (for the model)', comment),
      el('div', { class: 'buttons' },
        action('Approve', resolve('APPROVAL_VERDICT_APPROVE'), { class: 'approve' }),
        action('Deny', resolve('APPROVAL_VERDICT_DENY'), { class: 'deny' })));
  }
  if (inv.pendingQuestion !== undefined && inv.pendingInput) {
    return inputForm(inv, done);
  }
  if (inv.pendingQuestion !== undefined) {
    const answer = el('textarea', { rows: 3 });
    return el('div', { class: 'wait question', dataset: { id } },
      el('h2', {}, 'Question'),
      el('p', {}, inv.pendingQuestion),
      field('Answer', answer),
      action('Answer', async () => {
        await api('POST', '/v1/invocations/' + encodeURIComponent(id) + ':answerClarification', {
          answer: answer.value,
          actor: actor(),
        });
        await done();
      }, { class: 'answer' }));
  }
  return el('p', {}, 'Waits for a reply this console does not know.');
}

/**
 * A tool's question (an MCP server's elicitation): one control per property of its
 * requested schema (a flat object of strings, numbers, booleans and enums), filled with
 * the schema's defaults; accept sends the filled ones as a JSON object, which the server
 * checks against the schema; decline and cancel send nothing.
 */
function inputForm(inv, done) {
  const id = inv.invocationId;
  const asked = inv.pendingInput;
  let schema = {};
  try {
    schema = JSON.parse(asked.requestedSchemaJson || '{}') || {};
  } catch (error) {
    schema = {};
  }
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const properties = schema.properties && typeof schema.properties === 'object' ? schema.properties : {};
  const controls = Object.entries(properties).map(([name, property]) => inputControl(name, property || {}, required.has(name)));
  const reply = (inputAction, answer) => async () => {
    await api('POST', '/v1/invocations/' + encodeURIComponent(id) + ':answerClarification', {
      answer,
      action: inputAction,
      actor: actor(),
    });
    await done();
  };
  const accept = async () => {
    const content = {};
    for (const control of controls) {
      const value = control.value();
      if (value !== undefined) content[control.name] = value;
    }
    await reply('INPUT_ACTION_ACCEPT', JSON.stringify(content))();
  };
  return el('div', { class: 'wait question input', dataset: { id } },
    el('h2', {}, 'Question from a tool'),
    el('p', {}, inv.pendingQuestion),
    el('p', { class: 'muted' }, 'Asked by ', el('code', {}, asked.tool || ''), ' (call ',
      el('code', {}, asked.callId || ''), '); the call is sent again with the answer.'),
    controls.map((control) => control.node),
    el('div', { class: 'buttons' },
      action('Accept', accept, { class: 'answer' }),
      action('Decline', reply('INPUT_ACTION_DECLINE', ''), { class: 'deny' }),
      action('Cancel', reply('INPUT_ACTION_CANCEL', ''), { class: 'deny' })));
}

/** One property of a requested schema as a labelled control, and how to read it. */
function inputControl(name, property, required) {
  const label = (property.title || name) + (required ? ' (required)' : '');
  const hint = property.description ? el('p', { class: 'muted' }, property.description) : null;
  const choices = property.enum
    || (Array.isArray(property.oneOf) ? property.oneOf.map((o) => o.const) : null);
  const titles = property.enumNames
    || (Array.isArray(property.oneOf) ? property.oneOf.map((o) => o.title || o.const) : null);
  const items = property.items || {};
  const itemChoices = items.enum
    || (Array.isArray(items.anyOf) ? items.anyOf.map((o) => o.const) : null);
  const itemTitles = Array.isArray(items.anyOf) ? items.anyOf.map((o) => o.title || o.const) : itemChoices;
  const has = property.default !== undefined;
  let input;
  let value;
  if (property.type === 'boolean') {
    input = el('input', { type: 'checkbox', checked: has && property.default === true });
    // An unset optional box says nothing; a required one says false.
    value = () => (input.checked ? true : (required || has ? false : undefined));
  } else if (property.type === 'array' && itemChoices) {
    const chosen = new Set(has && Array.isArray(property.default) ? property.default : []);
    input = el('select', { multiple: true },
      itemChoices.map((choice, i) => el('option', { value: String(choice), selected: chosen.has(choice) }, String(itemTitles[i]))));
    value = () => {
      const picked = Array.from(input.selectedOptions).map((o) => o.value);
      return picked.length || required ? picked : undefined;
    };
  } else if (choices) {
    input = el('select', {},
      required ? null : el('option', { value: '' }, '—'),
      choices.map((choice, i) => el('option', { value: String(choice), selected: has && property.default === choice }, String(titles ? titles[i] : choice))));
    value = () => (input.value === '' ? undefined : input.value);
  } else if (property.type === 'number' || property.type === 'integer') {
    input = el('input', { type: 'number', step: property.type === 'integer' ? '1' : 'any', value: has ? String(property.default) : '' });
    value = () => (input.value === '' ? undefined : Number(input.value));
  } else {
    input = el('input', { type: 'text', value: has ? String(property.default) : '' });
    value = () => (input.value === '' && !required ? undefined : input.value);
  }
  input.dataset.property = name;
  return { name, value, node: el('div', {}, field(label, input), hint) };
}

/**
 * Cards in `list` by key, kept while their key stays, so that what a person is typing
 * into one survives the next refresh. `sync` takes the current [key, build] pairs,
 * builds the new cards, removes the gone ones and shows `empty` when none is left.
 */
function keptCards(list, empty) {
  const cards = new Map();
  return (wanted) => {
    const seen = new Set();
    for (const [key, build] of wanted) {
      seen.add(key);
      if (cards.has(key)) continue;
      const card = build();
      cards.set(key, card);
      list.append(card);
    }
    for (const [key, card] of cards) {
      if (!seen.has(key)) { card.remove(); cards.delete(key); }
    }
    empty.hidden = cards.size > 0;
  };
}

function approvalsPage(root) {
  const list = el('div', { class: 'inbox' });
  const empty = el('p', {}, 'Nothing waits for a human.');
  append(root, [el('h1', {}, 'Approvals and questions'), empty, list]);
  // A card is the same while its wait is: the same proposal, or the same question.
  const sync = keptCards(list, empty);
  async function refresh() {
    const page = await api('GET', '/v1/invocations' + query({ state: 'INVOCATION_STATE_WAITING', pageSize: 100 }));
    sync((page.invocations || []).map((inv) => [
      inv.invocationId + '/' + (inv.pendingApproval ? inv.pendingApproval.proposalDigest : 'q') + '/' + inv.lastSeq,
      () => el('article', { class: 'card', dataset: { id: inv.invocationId } },
        el('h2', {}, el('a', { href: '#/invocations/' + inv.invocationId }, inv.goal || inv.invocationId)),
        el('p', { class: 'muted' }, 'tenant ' + (inv.tenant || 'none') + ', actor ' + (inv.actor || 'none') +
          ', waiting since ' + when(inv.waitingSince) + (inv.waitUntil ? ', until ' + when(inv.waitUntil) : '')),
        replyForm(inv, refresh)),
    ]));
  }
  return every(LIST_REFRESH_MS, refresh);
}

function effectsPage(root) {
  const list = el('div', { class: 'inbox' });
  const empty = el('p', {}, 'No effect needs an operator.');
  append(root, [
    el('h1', {}, 'Effects needing an operator'),
    el('p', { class: 'muted' }, 'Writes the runtime could not reconcile: check the executor\'s system, ' +
      'then settle each as applied (with its receipt) or not applied. Settling needs the operator role.'),
    empty, list]);
  const sync = keptCards(list, empty);
  async function refresh() {
    const page = await api('GET', '/v1/invocations' + query({
      terminalReason: 'TERMINAL_REASON_RECONCILIATION_REQUIRED', pageSize: EFFECTS_SCAN,
    }));
    const wanted = [];
    for (const inv of page.invocations || []) {
      const effects = await api('GET', '/v1/effects:unresolved' + query({ invocationId: inv.invocationId }));
      for (const entry of effects.entries || []) {
        if (entry.state !== 'EFFECT_STATE_RECONCILIATION_REQUIRED') continue;
        wanted.push([entry.effectKey, () => settleCard(inv, entry, refresh)]);
      }
    }
    sync(wanted);
  }
  return every(LIST_REFRESH_MS, refresh);
}

function settleCard(inv, entry, done) {
  const applied = el('select', {},
    el('option', { value: 'EFFECT_STATE_COMMITTED' }, 'applied (committed)'),
    el('option', { value: 'EFFECT_STATE_REJECTED' }, 'not applied (rejected)'));
  const receipt = el('input', { type: 'text', spellcheck: 'false' });
  const detail = el('textarea', { rows: 2 });
  return el('article', { class: 'card', dataset: { key: entry.effectKey } },
    el('h2', {}, entry.tool || 'effect', ' ', el('code', {}, entry.effectKey)),
    el('p', {}, el('a', { href: '#/invocations/' + inv.invocationId }, inv.goal || inv.invocationId),
      ', call ' + entry.callId + ', attempt ' + (entry.attempt || 0) + ', since ' + when(entry.updatedAt)),
    entry.detail ? el('p', {}, entry.detail) : null,
    field('What you found', applied),
    field('Receipt (when applied)', receipt),
    field('How you checked', detail),
    action('Settle', async () => {
      await api('POST', '/v1/invocations/' + encodeURIComponent(inv.invocationId) + '/effects:settle', {
        effectKey: entry.effectKey,
        state: applied.value,
        receipt: receipt.value,
        detail: detail.value,
        actor: actor(),
      });
      await done();
    }, { class: 'settle' }));
}

function overviewPage(root) {
  const windowSelect = el('select', {},
    el('option', { value: '3600' }, 'the last hour'),
    el('option', { value: '86400', selected: true }, 'the last 24 hours'),
    el('option', { value: '604800' }, 'the last 7 days'),
    el('option', { value: '' }, 'all time'));
  const tenant = el('input', { type: 'text', spellcheck: 'false' });
  const out = el('div', { 'aria-live': 'polite' });
  const form = el('form', { class: 'filters', 'aria-label': 'Window' },
    field('Created in', windowSelect), field('Tenant', tenant),
    el('button', { type: 'submit' }, 'Apply'));
  append(root, [el('h1', {}, 'Overview'), form, out]);
  async function refresh() {
    const seconds = Number(windowSelect.value);
    const stats = await api('GET', '/v1/invocations:stats' + query({
      createdAfter: seconds ? new Date(Date.now() - seconds * 1000).toISOString() : '',
      tenant: tenant.value.trim(),
    }));
    const completed = stats.completed || {};
    const fixed = (n) => Number(n || 0).toFixed(1);
    clear(out);
    append(out, [
      el('dl', { class: 'summary' },
        el('dt', {}, 'Invocations'), el('dd', {}, String(stats.invocations || 0) + (stats.truncated ? ' (the newest; the window holds more)' : '')),
        el('dt', {}, 'Running'), el('dd', {}, String(stats.running || 0)),
        el('dt', {}, 'Waiting for a human'), el('dd', {}, String(stats.waiting || 0)),
        el('dt', {}, 'No-progress rate'), el('dd', {}, (100 * (stats.noProgressRate || 0)).toFixed(1) + '%')),
      table('Ended, by terminal reason', ['Reason', 'Count', 'p50', 'p95', 'p99'],
        (stats.byReason || []).map((r) => el('tr', {},
          el('th', { scope: 'row' }, reasonName(r.reason)), el('td', { class: 'n' }, r.count || 0),
          el('td', { class: 'n' }, r.p50 || '0s'), el('td', { class: 'n' }, r.p95 || '0s'),
          el('td', { class: 'n' }, r.p99 || '0s')))),
      table('Per completed run (' + (completed.runs || 0) + ' runs)',
        ['Turns', 'Tool calls', 'Input tokens', 'Output tokens', 'Cost'],
        [el('tr', {}, el('td', { class: 'n' }, fixed(completed.turns)), el('td', { class: 'n' }, fixed(completed.toolCalls)),
          el('td', { class: 'n' }, fixed(completed.inputTokens)), el('td', { class: 'n' }, fixed(completed.outputTokens)),
          el('td', { class: 'n' }, usd(completed.costMicroUsd)))]),
    ]);
  }
  form.addEventListener('submit', (event) => { event.preventDefault(); refresh().catch((e) => notice(explain(e))); });
  return every(STATS_REFRESH_MS, refresh);
}

// ---- routing and sign-in -------------------------------------------------------------

function route() {
  leave();
  notice('');
  const root = document.getElementById('page');
  clear(root);
  const hash = location.hash.replace(/^#\/?/, '');
  const [page, id] = hash.split('/');
  let current = page || 'invocations';
  if (current === 'invocations' && id) {
    leave = invocationPage(root, decodeURIComponent(id));
  } else if (current === 'approvals') {
    leave = approvalsPage(root);
  } else if (current === 'effects') {
    leave = effectsPage(root);
  } else if (current === 'overview') {
    leave = overviewPage(root);
  } else {
    current = 'invocations';
    leave = invocationsPage(root);
  }
  for (const link of document.querySelectorAll('nav a')) {
    if (link.dataset.page === current) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  document.title = 'agentloop: ' + current;
}

function showWho() {
  const who = document.getElementById('who');
  who.textContent = token() ? 'signed in with a token' : 'no token';
  document.getElementById('sign-out').hidden = !token();
}

function start() {
  const form = document.getElementById('sign-in');
  const tokenInput = document.getElementById('token');
  const actorInput = document.getElementById('actor');
  actorInput.value = sessionStorage.getItem(ACTOR_KEY) || '';
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const value = tokenInput.value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    tokenInput.value = '';
    const name = actorInput.value.trim();
    if (name) sessionStorage.setItem(ACTOR_KEY, name);
    else sessionStorage.removeItem(ACTOR_KEY);
    showWho();
    route();
  });
  document.getElementById('sign-out').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showWho();
    route();
  });
  window.addEventListener('hashchange', route);
  showWho();
  route();
}

document.addEventListener('DOMContentLoaded', start);
