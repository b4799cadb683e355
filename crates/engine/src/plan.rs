//! The concurrency plan of a batch: which calls may run together, and in which order.

use serde::{Deserialize, Serialize};

use crate::catalog::{SideEffect, ToolCatalog};
use crate::decision::ToolCall;

/// Stages of call indices (positions in the batch). Calls in one stage may run in
/// parallel; stages run one after another.
///
/// Call order is kept: a run of read-only calls forms one stage, a run of commutative
/// writes another, and every other write stands alone. A model that proposes
/// "transfer, then read the balance" gets exactly that order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionPlan {
    /// The stages, in order.
    pub stages: Vec<Vec<usize>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Group {
    Reads,
    CommutativeWrites,
    Alone,
}

impl ExecutionPlan {
    /// The plan for `calls`. Tools missing from the catalog (which validation refuses
    /// anyway) are treated as non-commutative writes: the safe choice.
    pub fn for_calls(calls: &[ToolCall], catalog: &ToolCatalog) -> ExecutionPlan {
        let mut stages: Vec<Vec<usize>> = Vec::new();
        let mut current: Option<Group> = None;
        for (index, call) in calls.iter().enumerate() {
            let group = match catalog.get(&call.tool) {
                Some(spec) => match spec.side_effect {
                    SideEffect::ReadOnly => Group::Reads,
                    SideEffect::IdempotentWrite | SideEffect::Write if spec.commutative => {
                        Group::CommutativeWrites
                    }
                    SideEffect::IdempotentWrite | SideEffect::Write => Group::Alone,
                },
                None => Group::Alone,
            };
            match stages.last_mut() {
                Some(stage) if current == Some(group) && group != Group::Alone => stage.push(index),
                Some(_) | None => stages.push(vec![index]),
            }
            current = Some(group);
        }
        ExecutionPlan { stages }
    }

    /// Whether every call may run at once.
    pub fn is_fully_parallel(&self) -> bool {
        self.stages.len() <= 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::ToolSpec;
    use crate::decision::CallId;

    fn calls(tools: &[&str]) -> Vec<ToolCall> {
        tools
            .iter()
            .enumerate()
            .map(|(i, tool)| ToolCall {
                call_id: CallId::new(format!("c{i}")),
                tool: (*tool).to_owned(),
                arguments_json: "{}".into(),
            })
            .collect()
    }

    fn catalog() -> ToolCatalog {
        ToolCatalog::new()
            .with("read", ToolSpec::read_only())
            .with("write", ToolSpec::new(SideEffect::Write))
            .with(
                "tag",
                ToolSpec {
                    side_effect: SideEffect::IdempotentWrite,
                    commutative: true,
                    timeout_ms: None,
                    digest: None,
                },
            )
    }

    #[test]
    fn reads_run_together_writes_alone_in_call_order() {
        let plan = ExecutionPlan::for_calls(
            &calls(&["read", "read", "write", "write", "read"]),
            &catalog(),
        );
        assert_eq!(plan.stages, vec![vec![0, 1], vec![2], vec![3], vec![4]]);
        assert!(!plan.is_fully_parallel());
    }

    #[test]
    fn commutative_writes_group_but_not_with_reads() {
        let plan = ExecutionPlan::for_calls(&calls(&["tag", "tag", "read", "tag"]), &catalog());
        assert_eq!(plan.stages, vec![vec![0, 1], vec![2], vec![3]]);
        let plan = ExecutionPlan::for_calls(&calls(&["read", "read"]), &catalog());
        assert!(plan.is_fully_parallel());
    }
}
