//! The remote agents runs may delegate to: their cards, fetched at start (bounded) and refreshed
//! in the background, and the `delegate_to_agent` tool the model calls. The call itself is run by
//! the engine (`agent/delegation/`), which records the remote task durably before it waits.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::card::{self, RemoteCard};
use super::config::AgentConfig;
use super::rpc::A2aClient;
use crate::tools::{Tool, ToolContext, ToolError, ToolSource};

/// The tool's name.
pub const DELEGATE_TOOL: &str = "delegate_to_agent";

/// How long fetching a card, and one call to a remote agent, may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// One remote agent and what we know of it.
pub struct RemoteAgent {
    pub config: AgentConfig,
    card: RwLock<Result<RemoteCard, String>>,
}

impl RemoteAgent {
    /// Its card, or why there is none yet.
    pub fn card(&self) -> Result<RemoteCard, String> {
        self.card
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A client for it (from its current card).
    ///
    /// # Errors
    /// No card could be fetched yet, or a configured header is invalid.
    pub fn client(&self) -> Result<A2aClient, String> {
        let card = self
            .card()
            .map_err(|e| format!("the agent `{}` is unavailable: {e}", self.config.name))?;
        A2aClient::new(&card, &self.config.headers, Duration::from_secs(10))
    }

    async fn refresh(&self) {
        let fetched = card::fetch(&self.config.card_url, &self.config.headers, CALL_TIMEOUT).await;
        if let Err(e) = &fetched {
            warn!(agent = %self.config.name, error = %e, "A2A agent card not fetched");
        }
        let mut slot = self.card.write().unwrap_or_else(PoisonError::into_inner);
        // A failed refresh keeps the last good card: the agent may be briefly down.
        if fetched.is_ok() || slot.is_err() {
            *slot = fetched;
        }
    }
}

/// The configured remote agents.
pub struct RemoteAgents {
    agents: Vec<Arc<RemoteAgent>>,
}

impl RemoteAgents {
    /// Fetch every card (waiting at most `CALL_TIMEOUT`), then refresh them every `refresh` on
    /// `tracker` until `stop`.
    pub async fn start(
        configs: Vec<AgentConfig>,
        refresh: Duration,
        tracker: &TaskTracker,
        stop: &CancellationToken,
    ) -> Arc<Self> {
        let agents: Vec<Arc<RemoteAgent>> = configs
            .into_iter()
            .map(|config| {
                Arc::new(RemoteAgent {
                    config,
                    card: RwLock::new(Err("not fetched yet".into())),
                })
            })
            .collect();
        futures::future::join_all(agents.iter().map(|a| a.refresh())).await;
        for a in &agents {
            let (a, stop) = (a.clone(), stop.clone());
            tracker.spawn(async move {
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(refresh) => a.refresh().await,
                    }
                }
            });
        }
        info!(agents = agents.len(), "A2A agents configured");
        Arc::new(Self { agents })
    }

    /// The agent named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<RemoteAgent>> {
        self.agents.iter().find(|a| a.config.name == name)
    }

    /// Their names.
    pub fn names(&self) -> Vec<String> {
        self.agents.iter().map(|a| a.config.name.clone()).collect()
    }

    /// What the model reads of them: one line per agent, its description and skills.
    pub fn describe(&self) -> String {
        self.agents
            .iter()
            .map(|a| match a.card() {
                Ok(c) => {
                    let skills: Vec<&str> = c.skills.iter().map(|s| s.1.as_str()).collect();
                    format!(
                        "- {}: {}{}",
                        a.config.name,
                        if c.description.is_empty() {
                            &c.name
                        } else {
                            &c.description
                        },
                        if skills.is_empty() {
                            String::new()
                        } else {
                            format!(" (skills: {})", skills.join(", "))
                        }
                    )
                }
                Err(e) => format!("- {}: unavailable now ({e})", a.config.name),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `delegate_to_agent {agent, message}`: listed like any tool; its calls are run by the engine.
pub struct DelegateTool {
    description: String,
    agents: Vec<String>,
}

impl DelegateTool {
    /// The tool over `agents` (described as they are now).
    pub fn new(agents: &RemoteAgents) -> Self {
        Self {
            description: format!(
                "Delegate a task to a remote agent: send it `message` (everything it needs to \
                 know); its answer is the result. Remote agents:\n{}",
                agents.describe()
            ),
            agents: agents.names(),
        }
    }
}

#[async_trait]
impl Tool for DelegateTool {
    fn name(&self) -> &str {
        DELEGATE_TOOL
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": self.agents, "description": "Which remote agent"},
                "message": {"type": "string", "minLength": 1, "description": "What to ask it"}
            },
            "required": ["agent", "message"],
            "additionalProperties": false
        })
    }
    fn source(&self) -> ToolSource {
        ToolSource::A2a
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        Err(ToolError::Failed(
            "`delegate_to_agent` is run by the engine, which records the remote task first".into(),
        ))
    }
}
