//! The remote agents runs may delegate to: their cards, fetched at start (bounded) and refreshed
//! in the background, and how the `delegate_to_agent` tool over them reads. The engine's
//! delegation calls (`agent/calls/delegation/`) offer the tool, and run each call, recording the
//! remote task durably before it waits.
//! Every request to an agent goes through its [`Reach`] (SSRF guard, headers, size bound).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::card::{self, RemoteCard};
use super::config::AgentConfig;
use super::net::{Net, NetSettings, Reach, bound_text};
use super::rpc::A2aClient;
use crate::llm::ToolSpec;

/// The tool's name.
pub const DELEGATE_TOOL: &str = "delegate_to_agent";

/// How long fetching a card, and one call to a remote agent, may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The most bytes of an agent's card text (description, skills) in the tool's description: it is
/// in every prompt that offers the tool, so far less than a card may hold.
const DESCRIBE_MAX_BYTES: usize = 2048;

/// Why an agent has no card.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CardError {
    /// None was fetched yet.
    #[error("not fetched yet")]
    NotFetched,
    /// Fetching it failed: the card module's reason, a message (its own error type is text).
    #[error("{0}")]
    Fetch(String),
}

/// Why no client can reach an agent now.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the agent `{agent}` is unavailable: {source}")]
pub struct Unavailable {
    pub agent: String,
    #[source]
    pub source: CardError,
}

/// Why the remote agents could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The HTTP clients could not be built.
    #[error(transparent)]
    Net(#[from] super::net::ClientBuildError),
    /// An agent's configuration cannot be used.
    #[error("A2A agent `{agent}`: {reason}")]
    Agent {
        agent: String,
        #[source]
        reason: super::net::ReachError,
    },
}

/// One remote agent and what we know of it.
pub struct RemoteAgent {
    pub config: AgentConfig,
    reach: Reach,
    card: RwLock<Result<RemoteCard, CardError>>,
}

impl RemoteAgent {
    /// Its card, or why there is none yet.
    ///
    /// # Errors
    /// None was fetched yet, or the last fetch (with none before it) failed.
    pub fn card(&self) -> Result<RemoteCard, CardError> {
        self.card
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A client for it (from its current card).
    ///
    /// # Errors
    /// No card could be fetched yet.
    pub fn client(&self) -> Result<A2aClient, Unavailable> {
        let card = self.card().map_err(|source| Unavailable {
            agent: self.config.name.clone(),
            source,
        })?;
        Ok(A2aClient::new(self.reach.clone(), &card))
    }

    async fn refresh(&self) {
        let fetched = card::fetch(&self.reach, &self.config.card_url, CALL_TIMEOUT)
            .await
            .map_err(CardError::Fetch);
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
    /// `tracker` until `stop`. `net` says what they may reach and how much is read of them.
    ///
    /// # Errors
    /// The HTTP clients cannot be built, or an agent's configuration cannot be used.
    pub async fn start(
        configs: Vec<AgentConfig>,
        net: NetSettings,
        refresh: Duration,
        tracker: &TaskTracker,
        stop: &CancellationToken,
    ) -> Result<Arc<Self>, StartError> {
        let net = Arc::new(Net::new(net)?);
        let agents: Vec<Arc<RemoteAgent>> = configs
            .into_iter()
            .map(|config| {
                let reach =
                    Reach::new(net.clone(), &config).map_err(|reason| StartError::Agent {
                        agent: config.name.clone(),
                        reason,
                    })?;
                Ok(Arc::new(RemoteAgent {
                    config,
                    reach,
                    card: RwLock::new(Err(CardError::NotFetched)),
                }))
            })
            .collect::<Result<_, StartError>>()?;
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
        info!(
            agents = agents.len(),
            allowed = %net.allow_list(),
            "A2A agents configured; their endpoints reach public addresses, their configured \
             origins, and beyond them only what PES_A2A_ALLOW allows"
        );
        Ok(Arc::new(Self { agents }))
    }

    /// The agent named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<RemoteAgent>> {
        self.agents.iter().find(|a| a.config.name == name)
    }

    /// Their names.
    pub fn names(&self) -> Vec<String> {
        self.agents.iter().map(|a| a.config.name.clone()).collect()
    }

    /// `delegate_to_agent {agent, message}` over them, as the model reads it (described as they
    /// are now): the engine's delegation calls offer it.
    pub fn delegate_spec(&self) -> ToolSpec {
        ToolSpec {
            name: DELEGATE_TOOL.to_owned(),
            description: format!(
                "Delegate a task to a remote agent: send it `message` (everything it needs to \
                 know); its answer is the result. Remote agents:\n{}",
                self.describe()
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "enum": self.names(), "description": "Which remote agent"},
                    "message": {"type": "string", "minLength": 1, "description": "What to ask it"}
                },
                "required": ["agent", "message"],
                "additionalProperties": false
            }),
        }
    }

    /// What the model reads of them: one line per agent, its description and skills (the remote's
    /// text cut to `DESCRIBE_MAX_BYTES` per agent).
    pub fn describe(&self) -> String {
        self.agents
            .iter()
            .map(|a| match a.card() {
                Ok(c) => {
                    let skills: Vec<&str> = c.skills.iter().map(|s| s.1.as_str()).collect();
                    let text = format!(
                        "{}{}",
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
                    );
                    format!(
                        "- {}: {}",
                        a.config.name,
                        bound_text(&text, DESCRIBE_MAX_BYTES, 0)
                    )
                }
                Err(e) => format!(
                    "- {}: unavailable now ({})",
                    a.config.name,
                    bound_text(&e.to_string(), DESCRIBE_MAX_BYTES, 0)
                ),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
