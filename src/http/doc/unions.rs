//! Two passes over the finished document's schemas that leave a client generator nothing to name
//! itself: a copy of a named schema that utoipa wrote inline (a generic `Page<T>`'s items) becomes
//! a `$ref` to it, and a tagged union (a serde `#[serde(tag = "…")]` enum, written by utoipa as a
//! `oneOf` of anonymous objects) becomes a `oneOf` of named variants with a `discriminator`. A
//! generator names anonymous variants after their position (`Stage_type_0`, …) and drops those
//! whose inner names collide; named variants whose tag is a `const` read back as the right type.
//! Neither pass changes what a schema accepts.

use std::collections::BTreeMap;

use serde_json::json;
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayItems, Discriminator, Object, Schema, Type,
};
use utoipa::openapi::{Components, Ref, RefOr};

/// A string schema that holds only `value`: JSON Schema's `const`, which utoipa's schema model
/// lacks, written through the object's extensions (they serialize beside its other keywords).
pub(super) fn const_string(value: &str, description: Option<&str>) -> RefOr<Schema> {
    let mut o = Object::with_type(Type::String);
    o.description = description.map(str::to_owned);
    o.extensions
        .get_or_insert_with(Default::default)
        .insert("const".to_owned(), json!(value));
    RefOr::T(Schema::Object(o))
}

/// A `$ref` to the component schema `name`.
pub(super) fn reference(name: &str) -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(name))
}

/// `snake_case`, `kebab-case` or `SCREAMING_CASE` as `PascalCase`.
pub(super) fn pascal(text: &str) -> String {
    text.split(['_', '-', ' '])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let lower = w.to_ascii_lowercase();
            let mut chars = lower.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The single string value of an `enum` schema with one value, if `schema` is one.
fn single_value(schema: &RefOr<Schema>) -> Option<&str> {
    match schema {
        RefOr::T(Schema::Object(o)) => match o.enum_values.as_deref() {
            Some([value]) => value.as_str(),
            _ => None,
        },
        _ => None,
    }
}

/// When `items` are inline objects that all require one property holding a single string
/// value (serde's tag), that property's name.
fn tag_of(items: &[RefOr<Schema>]) -> Option<String> {
    let objects: Vec<&Object> = items
        .iter()
        .map(|i| match i {
            RefOr::T(Schema::Object(o)) => Some(o),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let first = objects.first()?;
    first
        .properties
        .iter()
        .filter(|(_, schema)| single_value(schema).is_some())
        .map(|(name, _)| name)
        .find(|name| {
            objects.iter().all(|o| {
                o.required.contains(name)
                    && o.properties
                        .get(*name)
                        .is_some_and(|s| single_value(s).is_some())
            })
        })
        .cloned()
}

/// Give every variant of each component tagged union a name (`<Tag value><Union>`, e.g.
/// `SetStage`, `ApproveResumeRequest`), its tag a `const`, and the union a `discriminator`.
///
/// # Panics
/// When a variant's name is already a component's (a document that could not be generated).
pub(super) fn name_tagged_unions(components: &mut Components) {
    let unions: Vec<String> = components
        .schemas
        .iter()
        .filter_map(|(name, schema)| match schema {
            RefOr::T(Schema::OneOf(one)) => tag_of(&one.items).map(|_| name.clone()),
            _ => None,
        })
        .collect();
    for union in unions {
        let Some(RefOr::T(Schema::OneOf(mut one))) = components.schemas.remove(&union) else {
            continue;
        };
        let tag = tag_of(&one.items).expect("checked above");
        let mut mapping = BTreeMap::new();
        for item in &mut one.items {
            let RefOr::T(Schema::Object(mut variant)) = std::mem::replace(item, reference(""))
            else {
                unreachable!("tag_of checked every item is an inline object");
            };
            let value = single_value(&variant.properties[&tag])
                .expect("checked above")
                .to_owned();
            let name = format!("{}{union}", pascal(&value));
            let description = match &variant.properties[&tag] {
                RefOr::T(Schema::Object(o)) => o.description.clone(),
                _ => None,
            };
            variant
                .properties
                .insert(tag.clone(), const_string(&value, description.as_deref()));
            assert!(
                !components.schemas.contains_key(&name),
                "the variant `{value}` of `{union}` would be named `{name}`, a schema already"
            );
            components
                .schemas
                .insert(name.clone(), RefOr::T(Schema::Object(variant)));
            mapping.insert(value, format!("#/components/schemas/{name}"));
            *item = reference(&name);
        }
        one.discriminator = Some(Discriminator::with_mapping(tag, mapping));
        components
            .schemas
            .insert(union, RefOr::T(Schema::OneOf(one)));
    }
}

/// Make each variant of the component union `union` refuse properties it does not name (the
/// type behind it is read with `deny_unknown_fields`, which utoipa does not carry to variants).
///
/// # Panics
/// When `union` is not a union of named object variants.
pub(super) fn close_variants(components: &mut Components, union: &str) {
    let Some(RefOr::T(Schema::OneOf(one))) = components.schemas.get(union) else {
        panic!("`{union}` is a union");
    };
    let names: Vec<String> = one
        .items
        .iter()
        .map(|i| match i {
            RefOr::Ref(r) => r
                .ref_location
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned(),
            RefOr::T(_) => panic!("`{union}`'s variants are named"),
        })
        .collect();
    for name in names {
        let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut(&name) else {
            panic!("`{name}` is an object schema");
        };
        o.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
    }
}

/// Whether a component is worth a `$ref` wherever a copy of it appears: an object with
/// properties, or a composition (never a bare string or number, which may match by chance).
fn referable(schema: &RefOr<Schema>) -> bool {
    match schema {
        RefOr::T(Schema::Object(o)) => !o.properties.is_empty(),
        RefOr::T(Schema::OneOf(_) | Schema::AllOf(_) | Schema::AnyOf(_)) => true,
        _ => false,
    }
}

/// Replace every inline copy of a component schema, inside the other components, with a `$ref`
/// to it (utoipa inlines the type argument of a generic such as `Page<Observation>`).
pub(super) fn reference_inline_copies(components: &mut Components) {
    let named: Vec<(String, RefOr<Schema>)> = components
        .schemas
        .iter()
        .filter(|(_, s)| referable(s))
        .map(|(n, s)| (n.clone(), s.clone()))
        .collect();
    for (name, schema) in components.schemas.iter_mut() {
        // The component itself is not a copy; what it holds may be.
        visit_children(schema, &mut |child| {
            if let Some((other, _)) = named.iter().find(|(n, s)| n != name && s == child) {
                *child = reference(other);
                true
            } else {
                false
            }
        });
    }
}

/// Call `f` on each schema directly inside `schema`, then on theirs, except below a schema
/// `f` replaced (it returned `true`).
fn visit_children(schema: &mut RefOr<Schema>, f: &mut dyn FnMut(&mut RefOr<Schema>) -> bool) {
    let RefOr::T(schema) = schema else { return };
    let mut visit = |child: &mut RefOr<Schema>| {
        if !f(child) {
            visit_children(child, f);
        }
    };
    match schema {
        Schema::Object(o) => {
            for p in o.properties.values_mut() {
                visit(p);
            }
            if let Some(extra) = o.additional_properties.as_deref_mut()
                && let AdditionalProperties::RefOr(s) = extra
            {
                visit(s);
            }
        }
        Schema::Array(a) => {
            if let ArrayItems::RefOrSchema(items) = &mut a.items {
                visit(items);
            }
        }
        Schema::OneOf(c) => c.items.iter_mut().for_each(visit),
        Schema::AllOf(c) => c.items.iter_mut().for_each(visit),
        Schema::AnyOf(c) => c.items.iter_mut().for_each(visit),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_pascal_case() {
        assert_eq!(pascal("RUN_STARTED"), "RunStarted");
        assert_eq!(pascal("A2A_TASK_UPDATE"), "A2aTaskUpdate");
        assert_eq!(pascal("approve"), "Approve");
        assert_eq!(pascal("input-required"), "InputRequired");
    }
}
