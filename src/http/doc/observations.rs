//! What each observation's `content` holds, for the document: the `Observation` schema is a
//! union over `type` of named `<Type>Observation` schemas, each with its content schema
//! (`PlanContent`, `ToolExecutionContent`, …), so a client generated from the document reads a
//! typed payload. The content types are the ones the emitters serialize
//! ([`crate::model::payloads`]); where a payload is open (`additionalProperties: true`) the
//! document says so. The tests that read real runs through the document (`tests/api/openapi.rs`)
//! hold them to what the server sends.

use utoipa::ToSchema;
use utoipa::openapi::schema::{AdditionalProperties, Discriminator, OneOf, Schema};
use utoipa::openapi::{Components, RefOr};

use super::unions::{const_string, pascal, reference};
use crate::model::ObservationType;
use crate::model::payloads::*;

/// The content schema of one observation type.
struct Content {
    /// Its component name (`PlanContent`).
    name: String,
    schema: RefOr<Schema>,
    /// The named schemas it refers to (`TodoSummary`, …).
    nested: Vec<(String, RefOr<Schema>)>,
    /// Whether the content may hold fields the schema does not name.
    open: bool,
}

/// The content schema of each observation type. A new type must be added here: the match is
/// exhaustive.
fn content_of(t: ObservationType) -> Content {
    fn named<T: ToSchema>(open: bool) -> Content {
        let mut nested = Vec::new();
        T::schemas(&mut nested);
        Content {
            name: T::name().into_owned(),
            schema: T::schema(),
            nested,
            open,
        }
    }
    use ObservationType as O;
    match t {
        O::RunStarted => named::<RunStartedContent>(false),
        O::Intent => named::<IntentContent>(false),
        O::Title => named::<TitleContent>(false),
        O::Plan => named::<PlanContent>(false),
        O::PlanUpdate => named::<PlanUpdateContent>(false),
        O::ItemStatusChange => named::<ItemStatusChangeContent>(false),
        O::Thoughts => named::<ThoughtsContent>(false),
        O::ToolCall => named::<ToolCallContent>(false),
        O::ToolExecution => named::<ToolExecutionContent>(false),
        O::AgentSuspended => named::<AgentSuspendedContent>(false),
        O::AgentResumed => named::<AgentResumedContent>(false),
        O::Synthesis => named::<SynthesisContent>(false),
        O::FinalResponse => named::<FinalResponseContent>(false),
        O::Error => named::<ErrorContent>(false),
        O::RunCompleted => named::<RunCompletedContent>(false),
        O::RunFailed => named::<RunFailedContent>(false),
        O::RunCancelled => named::<RunCancelledContent>(false),
        O::RunSuspended => named::<RunSuspendedContent>(false),
        O::Compaction => named::<CompactionContent>(false),
        O::FlowchartStep => named::<FlowchartStepContent>(true),
        O::A2aTaskUpdate => named::<A2aTaskUpdateContent>(true),
        O::Budget => named::<BudgetContent>(false),
        O::Steering => named::<SteeringContent>(false),
    }
}

/// The name of the schema of observations of type `t` (`PLAN` → `PlanObservation`).
pub(super) fn observation_schema_name(t: ObservationType) -> String {
    format!("{}Observation", pascal(t.as_str()))
}

/// Make `Observation` the union of one named schema per type (each the derived `Observation`
/// with its `type` a `const` and its `content` that type's content schema), and add the
/// content schemas.
///
/// # Panics
/// When the components have no derived `Observation` object to start from.
pub(super) fn document(components: &mut Components) {
    let Some(RefOr::T(Schema::Object(base))) = components.schemas.get("Observation").cloned()
    else {
        panic!("the document has an `Observation` object schema");
    };
    let mut union = OneOf::new();
    let mut mapping = Vec::new();
    for &t in ObservationType::ALL {
        let Content {
            name: content,
            mut schema,
            nested,
            open,
        } = content_of(t);
        if open && let RefOr::T(Schema::Object(o)) = &mut schema {
            o.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(true)));
        }
        components.schemas.extend(nested);
        components.schemas.insert(content.clone(), schema);

        let name = observation_schema_name(t);
        let mut variant = base.clone();
        variant.description = Some(format!("An observation of type `{t}`."));
        variant
            .properties
            .insert("type".into(), const_string(t.as_str(), None));
        variant
            .properties
            .insert("content".into(), reference(&content));
        components
            .schemas
            .insert(name.clone(), RefOr::T(Schema::Object(variant)));
        union.items.push(reference(&name));
        mapping.push((
            t.as_str().to_owned(),
            format!("#/components/schemas/{name}"),
        ));
    }
    union.description = base
        .description
        .map(|d| format!("{d} Its `content` depends on its `type` (one schema per type)."));
    union.discriminator = Some(Discriminator::with_mapping("type", mapping));
    components
        .schemas
        .insert("Observation".into(), RefOr::T(Schema::OneOf(union)));
}
