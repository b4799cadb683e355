#!/usr/bin/env python3
"""The client the MCP conformance suite runs: agentloop's gateway, pointed at the suite.

`@modelcontextprotocol/conformance client --command "client.py"` starts a test server for
one scenario and runs this program with the server's URL as the last argument, the
scenario's name in MCP_CONFORMANCE_SCENARIO and, for scenarios that need credentials,
a JSON object in MCP_CONFORMANCE_CONTEXT.

It does what an operator does: it writes a tool registry whose `[[mcp_servers]]` entry
points at the URL (credentials go to files the entry names, never into the entry; an
elicitation scenario's server has its questions answered with their defaults), and
a scripted model that calls the scenario's tool; then it runs one embedded invocation
with `agentloop run` and exits with its exit code. Everything the suite checks happens
on the wire between the gateway and the test server.

An authorization scenario that hands out client credentials takes the client
credentials grant. Any other one is an operator's login first (`agentloop mcp login`,
the authorization code grant): this program plays the operator's browser, opening the
URL the login prints and following the authorization server's redirect back to it.

AGENTLOOP_BIN names the agentloop binary (default: `agentloop` on PATH).
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.request

SERVER = "conf"
# Where the operator would publish the gateway's client metadata document (SEP-991): the
# suite's own stand-in for one, which its authorization servers take as a client ID.
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"

# The tool each scenario's server offers, and the arguments to call it with. A scenario
# not listed offers no tool: the run only connects (initialize, tools/list) and answers.
TOOLS = {
    "tools_call": ("add_numbers", {"a": 2, "b": 3}),
    "elicitation-sep1034-client-defaults": ("test_client_elicitation_defaults", {}),
    "sse-retry": ("test_reconnection", {}),
}
AUTH_TOOL = ("test-tool", {})


def write_secret(directory, name, value):
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(value)
    return path


def toml_string(value):
    # JSON strings are valid TOML basic strings for the characters used here.
    return json.dumps(value)


def client_credentials(scenario):
    return scenario.startswith("auth/client-credentials-")


def oauth_section(scenario, context, directory):
    """The entry's `[mcp_servers.oauth]` table: the client credentials the suite hands
    out, or a token file for a login (with the pre-registered client, if any)."""
    if not scenario.startswith("auth/"):
        return ""
    lines = ["", "[mcp_servers.oauth]"]
    if "client_id" in context:
        lines.append(f"client_id = {toml_string(context['client_id'])}")
    if "client_secret" in context:
        path = write_secret(directory, "client-secret", context["client_secret"])
        lines.append(f"client_secret_file = {toml_string(path)}")
    if client_credentials(scenario):
        if "private_key_pem" in context:
            path = write_secret(directory, "private-key.pem", context["private_key_pem"])
            lines.append(f"private_key_file = {toml_string(path)}")
            algorithm = context.get("signing_algorithm", "ES256")
            lines.append(f"signing_algorithm = {toml_string(algorithm)}")
    else:
        lines.append(f"token_file = {toml_string(os.path.join(directory, 'token.json'))}")
        if "client_id" not in context:
            lines.append(f"client_metadata_url = {toml_string(CLIENT_METADATA_URL)}")
    return "\n".join(lines) + "\n"


def login(binary, registry):
    """`agentloop mcp login`, with this program as the browser: the URL it prints is
    opened, and the authorization server's redirect followed back to the login."""
    process = subprocess.Popen(
        [binary, "mcp", "login", SERVER, "--tools", registry, "--wait", "20s"],
        stdout=subprocess.PIPE, text=True)
    url = process.stdout.readline().strip()
    if url:
        try:
            with urllib.request.urlopen(url, timeout=20) as page:
                page.read()
        except OSError as error:
            print(f"the browser could not follow {url}: {error}", file=sys.stderr)
    return process.wait(timeout=30)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: client.py SERVER_URL (run by the MCP conformance suite)")
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    binary = os.environ.get("AGENTLOOP_BIN", "agentloop")

    with tempfile.TemporaryDirectory(prefix="agentloop-conformance-") as directory:
        registry = os.path.join(directory, "tools.toml")
        with open(registry, "w") as out:
            out.write("[[mcp_servers]]\n")
            out.write(f"name = {toml_string(SERVER)}\n")
            out.write(f"url = {toml_string(url)}\n")
            out.write("timeout_ms = 20000\n")
            if scenario.startswith("elicitation-"):
                # The scenario asks to be accepted with its defaults within the call. The
                # default, `ask`, answers the first send `cancel` and waits for a person
                # (docs/tools.md, "Elicitation"), which the suite counts as a failure.
                out.write('elicitation = "defaults"\n')
            out.write(oauth_section(scenario, context, directory))

        tool = TOOLS.get(scenario) or (AUTH_TOOL if scenario.startswith("auth/") else None)
        turns = []
        if tool is not None:
            name, arguments = tool
            turns.append({"tool_calls": [
                {"id": "c1", "name": f"{SERVER}__{name}", "arguments": arguments}]})
            turns.append({"final": f"called {name}", "evidence": ["c1"]})
        else:
            turns.append({"final": "connected"})
        script = os.path.join(directory, "script.json")
        with open(script, "w") as out:
            json.dump({"turns": turns}, out)

        if scenario.startswith("auth/") and not client_credentials(scenario):
            code = login(binary, registry)
            if code != 0:
                sys.exit(code)

        run = subprocess.run(
            [binary, "--data-dir", os.path.join(directory, "data"), "run",
             "--tools", registry, "--script", script,
             "--goal", f"MCP conformance scenario {scenario}"],
            check=False,
        )
        sys.exit(run.returncode)


if __name__ == "__main__":
    main()
