"""Hangs: open and past episodes, the culprit and waiting ranks, and the merged stacks
of the chosen episode in the flame graph."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.models.dashboard import VariableSort

from rankwatch.grafana import panels
from rankwatch.grafana.common import board, board_url, job_variable, link, query_variable
from rankwatch.grafana.queries import hangs as q

UID = "rankwatch-hangs"


def build() -> Dashboard:
    episode = query_variable("episode", "Episode", q.EPISODES).sort(VariableSort.DISABLED)
    return (
        board(UID, "rankwatch / Hangs", "Has the job hung, who stopped first, and where.")
        .with_variable(job_variable())
        .with_variable(episode)
        .with_panel(
            panels.stat(
                "Open hangs",
                q.OPEN_HANGS,
                "Hang episodes of the job not resolved yet.",
                steps=((None, "green"), (1, "red")),
            )
        )
        .with_panel(
            panels.timeseries(
                "Hangs declared",
                q.HANGS_OVER_TIME,
                "Hang episodes declared per interval.",
                width=18,
            ).height(4)
        )
        .with_panel(
            panels.table(
                "Hang episodes",
                q.EPISODE_TABLE,
                "Open episodes first. Culprits stopped first; the waiting ranks block on"
                " them; silent ranks stopped sending heartbeats. Click a row to show its"
                " stacks.",
                links=[
                    link(
                        "Show this episode's stacks",
                        board_url(UID, job="${job}", episode="${__data.fields.episode_id}"),
                    )
                ],
            )
        )
        .with_panel(
            panels.flamegraph(
                "Merged stacks",
                q.FLAME,
                "Every rank's thread stacks of the episode merged: width is the number of"
                " ranks on a call path. A narrow branch beside a wide one is the odd rank"
                " out.",
            )
        )
        .with_panel(
            panels.table(
                "Call paths",
                q.STACK_TABLE,
                "Distinct call paths of the episode, fewest ranks first, with the ranks in"
                " and not in each path.",
            )
        )
    )
