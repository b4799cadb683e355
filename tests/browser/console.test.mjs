// The console in a real browser: Debian's Chromium, headless, driven by playwright-core.
//
// 1. Without authentication (`agentloop dev` as a developer runs it): a run that waits
//    for approval is found in the list, opened, approved by a click, and seen to
//    complete, with the transfer applied once by the demo executor's own record; a
//    question is answered there too; a run whose goal and answer hold HTML shows them
//    as text and runs none of it.
// 2. With authentication: a token signs in through the form and never appears in a
//    URL; one tenant's token never shows another tenant's run; a caller without the
//    approver role is refused the approval the approver then gives; a platform
//    operator's token sees every tenant, and the tenant filter narrows it to one.
// 3. A tool's question: the reference MCP server `server-everything` (stdio, from npm)
//    asks a person for a form; the inbox shows one control per field, its defaults
//    filled in; the answer typed there reaches the server, which echoes it.
//    Without `mcp-server-everything` on PATH this part is skipped, unless
//    AGENTLOOP_REQUIRE_MCP=1 (CI sets it).
//
// Each page is photographed into SCREENSHOTS (default target/console-screenshots).
// Run from the repository: `node tests/browser/console.test.mjs`, after
// `cargo build -p agentloop` and `npm ci --prefix tests/browser`.

import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

const BIN = resolve(process.env.AGENTLOOP_BIN || 'target/debug/agentloop');
const BROWSER = process.env.CHROMIUM || '/usr/bin/chromium';
const SHOTS = resolve(process.env.SCREENSHOTS || 'target/console-screenshots');
const POLICIES = resolve('deploy/policies/demo.cedar');
// How long any one wait may take before the test fails.
const WAIT_MS = 30_000;

const APPROVE_THEN_FINAL = JSON.stringify({
  turns: [
    { request_approval: { summary: 'move 42.00 from alice to bob', calls: [
      { id: 't1', name: 'transfer', arguments: { from: 'alice', to: 'bob', amount: 4200 } }] } },
    { final: 'moved 42.00', evidence: ['t1'] },
  ],
});

const ASKS = JSON.stringify({
  turns: [{ clarification: 'Which account should be refunded?' }, { final: 'noted' }],
});

// server-everything's form: `name` required, `integer` defaulting to 42.
const ASKS_FORM = JSON.stringify({
  turns: [
    { tool_calls: [{ id: 'form', name: 'everything__trigger-elicitation-request', arguments: {} }] },
    { final: 'the form came back', evidence: ['form'] },
  ],
});

const HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">';
const HOSTILE_SCRIPT = JSON.stringify({
  turns: [
    { tool_calls: [{ id: 'a', name: 'lookup', arguments: { key: 'profile' } }] },
    { final: 'profile ' + HOSTILE, evidence: ['a'] },
  ],
});

/** `agentloop dev` on free ports; resolves once it printed where the console is. */
async function dev(dataDir, extra = []) {
  const child = spawn(BIN, ['--data-dir', dataDir, 'dev', '--listen', '127.0.0.1:0',
    '--http', '127.0.0.1:0', ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (chunk) => { stderr = (stderr + chunk).slice(-20_000); });
  const lines = createInterface({ input: child.stdout });
  const base = await new Promise((done, fail) => {
    const timer = setTimeout(() => fail(new Error('dev printed no console URL:\n' + stderr)), WAIT_MS);
    child.on('exit', (code) => fail(new Error(`dev exited ${code}:\n${stderr}`)));
    lines.on('line', (line) => {
      const found = line.match(/^agentloop dev: the console on (http:\/\/[^ ]+)\/$/);
      if (found) { clearTimeout(timer); done(found[1]); }
    });
  });
  return { base, stop: () => child.kill('SIGTERM'), stderr: () => stderr };
}

/** One call of the HTTP/JSON API. */
async function call(base, method, path, body, token) {
  const headers = { 'content-type': 'application/json' };
  if (token) headers.authorization = 'Bearer ' + token;
  const response = await fetch(base + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = await response.json();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${JSON.stringify(json)}`);
  return json;
}

/** Reads an invocation's events until one satisfies `done`; the events read. */
async function until(base, id, done, token) {
  const headers = token ? { authorization: 'Bearer ' + token } : {};
  const response = await fetch(`${base}/v1/invocations/${id}/events`, {
    headers, signal: AbortSignal.timeout(WAIT_MS),
  });
  assert.equal(response.status, 200);
  const decoder = new TextDecoder();
  let buffer = '';
  const events = [];
  for await (const chunk of response.body) {
    buffer += decoder.decode(chunk, { stream: true });
    let cut;
    while ((cut = buffer.indexOf('\n\n')) >= 0) {
      const data = buffer.slice(0, cut).replace(/^data: /, '');
      buffer = buffer.slice(cut + 2);
      const event = JSON.parse(data).event;
      events.push(event);
      // Leaving the loop cancels the stream.
      if (done(event)) return events;
    }
  }
  throw new Error(`the events of ${id} ended before the awaited one: ${JSON.stringify(events)}`);
}

const waits = (event) => Boolean(event.ended && event.ended.waitUntil);
const ends = (event) => Boolean(event.ended && !event.ended.waitUntil);

async function start(base, script, goal, token) {
  // The demo policies let clerks move small amounts; a token's roles are its own.
  const roles = token ? undefined : ['clerk'];
  const started = await call(base, 'POST', '/v1/invocations', { goal, scriptedModelJson: script, roles }, token);
  return started.invocation.invocationId;
}

/** A page that fails the test on any script error or blocked resource. */
async function open(browser, base) {
  const context = await browser.newContext({ baseURL: base });
  const page = await context.newPage();
  const problems = [];
  const urls = [];
  page.on('pageerror', (error) => problems.push('page error: ' + error.message));
  page.on('console', (message) => {
    if (message.type() === 'error' && !/the server responded with a status of 4\d\d/.test(message.text())) {
      problems.push('console: ' + message.text());
    }
  });
  page.on('request', (request) => urls.push(request.url()));
  page.setDefaultTimeout(WAIT_MS);
  return { context, page, problems, urls };
}

async function shot(page, name) {
  await page.screenshot({ path: join(SHOTS, name), fullPage: true });
  console.log('screenshot', join(SHOTS, name));
}

/** Every control on the page has a label a screen reader reads. */
async function labelled(page) {
  const unlabelled = await page.evaluate(() =>
    [...document.querySelectorAll('input, select, textarea, button')]
      .filter((control) => !control.hidden && control.offsetParent !== null)
      .filter((control) => control.tagName === 'BUTTON'
        ? !control.textContent.trim() && !control.getAttribute('aria-label')
        : control.labels.length === 0 && !control.getAttribute('aria-label'))
      .map((control) => control.outerHTML));
  assert.deepEqual(unlabelled, [], 'controls without a label');
}

async function withoutAuth(browser) {
  const data = mkdtempSync(join(tmpdir(), 'agentloop-console-'));
  // Cedar policies judge every call, so the timeline names what permitted each one.
  const server = await dev(join(data, 'data'), ['--policies', POLICIES]);
  try {
    const { base } = server;
    const id = await start(base, APPROVE_THEN_FINAL, 'Move 42.00 from alice to bob');
    await until(base, id, waits);
    const hostile = await start(base, HOSTILE_SCRIPT, 'Look up ' + HOSTILE);
    await until(base, hostile, ends);

    const { context, page, problems, urls } = await open(browser, base);
    const first = await page.goto('/');
    assert.equal(first.status(), 200);
    assert.match(first.headers()['content-security-policy'], /script-src 'self'/);

    // The list shows the run, live, and the filters narrow it.
    const row = page.locator(`tr[data-id="${id}"]`);
    await row.waitFor();
    await page.getByLabel('State').selectOption('INVOCATION_STATE_WAITING');
    await page.getByRole('button', { name: 'Apply' }).click();
    await page.locator(`tr[data-id="${hostile}"]`).waitFor({ state: 'detached' });
    await row.waitFor();
    await labelled(page);
    await shot(page, '01-invocations.png');

    // Its timeline, and what it waits for.
    await row.getByRole('link').click();
    await page.getByRole('heading', { name: 'Approval', exact: true }).waitFor();
    await page.getByText('Waits: approval_required').waitFor();
    await page.getByText('"amount": 4200').first().waitFor();
    await labelled(page);
    await shot(page, '02-invocation-waiting.png');

    // The inbox: the exact call, bound to its digest; approved by a click.
    await page.getByRole('link', { name: 'Approvals' }).click();
    const card = page.locator(`article.card[data-id="${id}"]`);
    await card.waitFor();
    await card.getByText('transfer').first().waitFor();
    await card.getByText('Proposal digest').waitFor();
    await card.getByLabel('Comment (for the model)').fill('checked with alice');
    await labelled(page);
    await shot(page, '03-approvals.png');
    await card.getByRole('button', { name: 'Approve' }).click();
    await card.waitFor({ state: 'detached' });
    await page.getByText('Nothing waits for a human.').waitFor();

    // A question is answered in the inbox too, and the run goes on with the answer.
    const asks = await start(base, ASKS, 'Refund the customer');
    await until(base, asks, waits);
    const question = page.locator(`article.card[data-id="${asks}"]`);
    await question.getByText('Which account should be refunded?').waitFor();
    await question.getByLabel('Answer').fill('acct-1');
    await question.getByRole('button', { name: 'Answer' }).click();
    await question.waitFor({ state: 'detached' });
    const answered = await until(base, asks, ends);
    assert.equal(answered.at(-1).ended.reason, 'TERMINAL_REASON_COMPLETED');
    assert.ok(answered.some((event) => event.clarificationAnswered
      && event.clarificationAnswered.answer === 'acct-1'), 'the answer is in the log');

    // It completes; the timeline shows who approved and the write's ledger state.
    await page.goto(`/#/invocations/${id}`);
    await page.getByText('Ended: completed').waitFor();
    await page.getByText('Approved by console').waitFor();
    await page.locator('.effect .state', { hasText: 'committed' }).first().waitFor();
    await page.getByText('permitted by small-transfers-for-clerks').first().waitFor();
    await shot(page, '04-invocation-completed.png');

    // Applied once, by the executor's own record.
    const record = readFileSync(join(data, 'data', 'demo-executor', 'effects.jsonl'), 'utf8')
      .split('\n').filter(Boolean).map((line) => JSON.parse(line))
      .filter((entry) => entry.invocation_id === id);
    assert.equal(record.length, 1, `the transfer once in the record: ${JSON.stringify(record)}`);
    assert.equal(record[0].tool, 'transfer');
    assert.equal(JSON.parse(record[0].arguments_json).amount, 4200);

    // HTML from a model shows as text and never runs.
    await page.goto(`/#/invocations/${hostile}`);
    await page.getByText('Ended: completed').waitFor();
    assert.ok((await page.locator('main').innerText()).includes(HOSTILE), 'the answer shows as text');
    assert.equal(await page.evaluate(() => window.__pwned), undefined, 'no injected script ran');
    assert.equal(await page.locator('main img, main script').count(), 0);
    await shot(page, '05-html-shown-as-text.png');

    await page.getByRole('link', { name: 'Overview' }).click();
    const completed = page.locator('tr', { has: page.getByRole('rowheader', { name: 'completed' }) });
    await completed.getByRole('cell').first().filter({ hasText: '3' }).waitFor();
    await page.getByText('Per completed run (3 runs)').waitFor();
    await labelled(page);
    await shot(page, '06-overview.png');

    await page.getByRole('link', { name: 'Effects' }).click();
    await page.getByText('No effect needs an operator.').waitFor();
    await shot(page, '07-effects.png');

    // The keyboard reaches the pages: the skip link first, then the navigation.
    await page.goto('/#/invocations');
    await page.reload();
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Skip to content');
    await page.keyboard.press('Tab');
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Approvals');
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: 'Approvals and questions' }).waitFor();

    assert.deepEqual(problems, [], 'the page ran without errors');
    assert.ok(urls.every((url) => url.startsWith(base)), 'nothing loaded from elsewhere');
    await context.close();
  } finally {
    server.stop();
    rmSync(data, { recursive: true, force: true });
  }
}

async function withAuth(browser) {
  const data = mkdtempSync(join(tmpdir(), 'agentloop-console-auth-'));
  const secret = join(data, 'secret');
  writeFileSync(secret, 'a development secret of more than thirty-two bytes');
  const issuer = 'https://issuer.console.test';
  const config = join(data, 'orchestrator.toml');
  writeFileSync(config, `[auth]\nmode = "jwt"\nhs256_secret_file = "${secret}"\nissuer = "${issuer}"\naudience = "agentloop"\nall_tenants_role = "platform"\n`);
  const token = (actor, tenant, roles) => execFileSync(BIN, ['token', '--secret-file', secret,
    '--issuer', issuer, '--audience', 'agentloop', '--actor', actor, '--tenant', tenant,
    ...roles.flatMap((role) => ['--role', role])], { encoding: 'utf8' }).trim();
  const alice = token('alice', 'acme', ['approver']);
  const carol = token('carol', 'acme', []);
  const mallory = token('mallory', 'other', ['approver', 'operator']);
  const olga = token('olga', 'platform-ops', ['platform']);
  const server = await dev(join(data, 'data'), ['--config', config]);
  try {
    const { base } = server;
    const id = await start(base, APPROVE_THEN_FINAL, 'Move 42.00 for acme', alice);
    await until(base, id, waits, alice);
    const theirs = await start(base, APPROVE_THEN_FINAL, 'Move for other', mallory);
    await until(base, theirs, waits, mallory);

    const { context, page, problems, urls } = await open(browser, base);
    await page.goto('/');
    await page.getByText('UNAUTHENTICATED').or(page.getByText('Sign in:')).first().waitFor();
    const signIn = async (value) => {
      await page.getByLabel('Bearer token').fill(value);
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.getByText('signed in with a token').waitFor();
    };

    // Mallory's token shows mallory's tenant only, here and by ID.
    await signIn(mallory);
    await page.locator(`tr[data-id="${theirs}"]`).waitFor();
    assert.equal(await page.locator(`tr[data-id="${id}"]`).count(), 0);
    await page.goto(`/#/invocations/${id}`);
    await page.getByText(/NOT_FOUND/).waitFor();
    await shot(page, '08-other-tenant-not-found.png');

    // Carol sees acme's run but may not approve it.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await signIn(carol);
    await page.goto('/#/approvals');
    const card = page.locator(`article.card[data-id="${id}"]`);
    await card.waitFor();
    assert.equal(await page.locator(`article.card[data-id="${theirs}"]`).count(), 0);
    await card.getByRole('button', { name: 'Approve' }).click();
    await page.getByText(/PERMISSION_DENIED.*approver/).waitFor();
    await shot(page, '09-approval-refused-without-the-role.png');

    // Alice approves it.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await signIn(alice);
    await card.getByRole('button', { name: 'Approve' }).click();
    await card.waitFor({ state: 'detached' });
    await page.goto(`/#/invocations/${id}`);
    await page.getByText('Ended: completed').waitFor();
    await page.getByText('Approved by alice').waitFor();

    // A platform operator sees both tenants, and the tenant filter narrows the list.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await signIn(olga);
    await page.goto('/#/invocations');
    await page.locator(`tr[data-id="${id}"]`).waitFor();
    await page.locator(`tr[data-id="${theirs}"]`).waitFor();
    await page.getByLabel('Tenant').fill('other');
    await page.getByRole('button', { name: 'Apply' }).click();
    await page.locator(`tr[data-id="${id}"]`).waitFor({ state: 'detached' });
    await page.locator(`tr[data-id="${theirs}"]`).waitFor();
    await shot(page, '10-all-tenants-filtered-by-tenant.png');

    for (const secretToken of [alice, carol, mallory, olga]) {
      assert.ok(urls.every((url) => !url.includes(secretToken)), 'a token in a URL');
    }
    assert.equal(await page.evaluate(() => localStorage.length), 0, 'nothing kept beyond the tab');
    assert.deepEqual(problems, [], 'the page ran without errors');
    await context.close();
  } finally {
    server.stop();
    rmSync(data, { recursive: true, force: true });
  }
}

/** Whether `program` is on PATH. */
function onPath(program) {
  return (process.env.PATH || '').split(':').some((dir) => {
    try {
      execFileSync('test', ['-x', join(dir, program)]);
      return true;
    } catch {
      return false;
    }
  });
}

async function toolQuestion(browser) {
  if (!onPath('mcp-server-everything')) {
    assert.notEqual(process.env.AGENTLOOP_REQUIRE_MCP, '1', 'mcp-server-everything is not on PATH');
    console.log('SKIPPED: a tool\'s question (mcp-server-everything is not on PATH)');
    return;
  }
  const data = mkdtempSync(join(tmpdir(), 'agentloop-console-mcp-'));
  const registry = join(data, 'tools.toml');
  writeFileSync(registry, '[[mcp_servers]]\nname = "everything"\ncommand = "mcp-server-everything"\nargs = ["stdio"]\n');
  const server = await dev(join(data, 'data'), ['--tools', registry]);
  try {
    const { base } = server;
    // The gateway lists the server's tools once it has started it: until then the
    // model's call is refused and the run ends; start again (bounded).
    const deadline = Date.now() + WAIT_MS;
    let id;
    for (;;) {
      id = await start(base, ASKS_FORM, 'Fill in the form');
      const events = await until(base, id, (event) => waits(event) || ends(event));
      if (waits(events.at(-1))) break;
      assert.ok(Date.now() < deadline, 'the tool never asked: ' + JSON.stringify(events.at(-1)));
      await new Promise((done) => setTimeout(done, 200));
    }

    const { context, page, problems, urls } = await open(browser, base);
    await page.goto('/#/approvals');
    const card = page.locator(`article.card[data-id="${id}"]`);
    await card.getByRole('heading', { name: 'Question from a tool' }).waitFor();
    await card.getByText('Please provide inputs for the following fields:').waitFor();
    await card.getByText('everything__trigger-elicitation-request').waitFor();
    // One control per field, the schema's defaults filled in.
    assert.equal(await card.getByLabel('Integer', { exact: true }).inputValue(), '42');
    await card.getByLabel('String (required)', { exact: true }).fill('Ada Lovelace');
    await card.getByLabel('Boolean', { exact: true }).check();
    await labelled(page);
    await shot(page, '11-tool-question.png');
    await card.getByRole('button', { name: 'Accept' }).click();
    await card.waitFor({ state: 'detached' });

    const events = await until(base, id, ends);
    assert.equal(events.at(-1).ended.reason, 'TERMINAL_REASON_COMPLETED');
    const answer = events.find((event) => event.clarificationAnswered).clarificationAnswered;
    assert.equal(answer.action, 'INPUT_ACTION_ACCEPT');
    const content = JSON.parse(answer.answer);
    assert.equal(content.name, 'Ada Lovelace');
    assert.equal(content.check, true);
    assert.equal(content.integer, 42);
    // The server got it: its tool's output echoes the answer.
    const output = events.filter((event) => event.turn && event.turn.turn === 1).at(-1)
      .turn.results[0].output.outputJson;
    assert.match(output, /Name: Ada Lovelace/);
    await page.goto(`/#/invocations/${id}`);
    await page.getByText('Ended: completed').waitFor();
    await page.getByText("Accepted a tool's question by console").waitFor();
    await shot(page, '12-tool-question-answered.png');

    assert.deepEqual(problems, [], 'the page ran without errors');
    assert.ok(urls.every((url) => url.startsWith(base)), 'nothing loaded from elsewhere');
    await context.close();
  } finally {
    server.stop();
    rmSync(data, { recursive: true, force: true });
  }
}

mkdirSync(SHOTS, { recursive: true });
const browser = await chromium.launch({ executablePath: BROWSER, headless: true });
try {
  await withoutAuth(browser);
  console.log('ok: without authentication');
  await withAuth(browser);
  console.log('ok: with authentication');
  await toolQuestion(browser);
  console.log("ok: a tool's question");
} finally {
  await browser.close();
}
