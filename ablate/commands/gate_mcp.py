"""The loop's gate as an MCP server on stdio (the official ``mcp`` SDK, the ``mcp`` extra): a coding
agent asks to try a change and reads the decision. Each tool is the Python call of the same name on
:class:`ablate.drive.loop.Loop`; the candidate's trials run through the driver in their own
processes, never in the agent's. A client that disconnects mid-candidate (its server ended with it)
leaves the candidate taken up in the ledger: the next ``try_change`` decides it, its finished seeds
read back, none counted twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.errors import AblateError


def server(folder: Path):
    """The MCP server over the loop in ``folder`` (its tools: try_change, status, history)."""
    try:
        from mcp.server.mcpserver import MCPServer
    except ImportError:
        raise AblateError("ablate gate serve needs the MCP SDK: pip install 'ablate-studies[mcp]'") from None
    from ablate.drive.loop import Loop

    Loop(folder)  # not a loop folder: one line, before any client connects
    mcp = MCPServer(
        "ablate-gate", instructions="Keep a change of a training configuration only when the seeds say so."
    )

    @mcp.tool()
    def try_change(description: str, overrides: list[str], simpler: bool = False) -> dict[str, Any]:
        """Try a change (key=value overrides of the incumbent's configuration): its seeds are trained
        paired with the incumbent's until the answer is clear or the budget is spent. Returns the
        decision: keep / revert / undecided / no change / failed, with delta, interval, seeds, level."""
        decisions = Loop(folder).try_change(description, overrides, simpler)
        return {"decisions": [d.as_dict() for d in decisions]}

    @mcp.tool()
    def status() -> dict[str, Any]:
        """The incumbent, the changes kept, the level the next candidate is tested at, the queue."""
        return Loop(folder).status()

    @mcp.tool()
    def history() -> dict[str, Any]:
        """Every candidate decided, in order."""
        return {"decisions": [d.as_dict() for d in Loop(folder).history()]}

    return mcp


def serve_loop(folder: Path) -> None:
    server(folder).run("stdio")
