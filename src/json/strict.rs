//! Deserializing a request body exactly as its schema says. serde's derived structs also accept a
//! JSON *array* (fields by position), so `[null, null]` became a thread and `"prompts": [..]` a
//! persona: the OpenAPI document, and every client generated from it, says those are objects.
//! [`from_value`] reads a parsed body through a deserializer that offers a struct only a JSON
//! object, at every depth; everything else behaves as `serde_json::from_value`.

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess,
    Unexpected, Visitor,
};
use serde_json::{Map, Value};

/// `T` from `value`, with structs read only from JSON objects.
///
/// # Errors
/// The first place where `value` does not fit `T`, as serde_json words it.
pub fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, serde_json::Error> {
    T::deserialize(Strict(value))
}

/// [`from_value`], with the path of the value that did not fit (`flowchart.stages.a.kind`), for
/// bodies whose errors must say where.
///
/// # Errors
/// The first place where `value` does not fit `T`, with its path.
pub fn from_value_at<T: DeserializeOwned>(
    value: &Value,
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(Strict(value))
}

/// A borrowed JSON value that refuses arrays where a struct is due.
#[derive(Clone, Copy)]
struct Strict<'a>(&'a Value);

fn unexpected(v: &Value) -> Unexpected<'_> {
    match v {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(_) => Unexpected::Other("number"),
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

macro_rules! forward_to_value {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                self.0.$method(visitor)
            }
        )*
    };
}

impl<'de> Deserializer<'de> for Strict<'de> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Array(items) => visitor.visit_seq(Seq(items.iter())),
            Value::Object(map) => visitor.visit_map(Fields::new(map)),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(map) => visitor.visit_map(Fields::new(map)),
            other => Err(de::Error::invalid_type(unexpected(other), &"an object")),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Array(items) => visitor.visit_seq(Seq(items.iter())),
            other => Err(de::Error::invalid_type(unexpected(other), &"an array")),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(map) => visitor.visit_map(Fields::new(map)),
            other => Err(de::Error::invalid_type(unexpected(other), &"an object")),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_unit_struct(name, visitor)
    }

    forward_to_value! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_identifier deserialize_ignored_any
    }
}

struct Seq<'a>(std::slice::Iter<'a, Value>);

impl<'de> SeqAccess<'de> for Seq<'de> {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(Strict(v)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Fields<'a> {
    iter: serde_json::map::Iter<'a>,
    value: Option<&'a Value>,
}

impl<'a> Fields<'a> {
    fn new(map: &'a Map<String, Value>) -> Self {
        Self {
            iter: map.iter(),
            value: None,
        }
    }
}

impl<'de> MapAccess<'de> for Fields<'de> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.iter.next() {
            Some((k, v)) => {
                self.value = Some(v);
                let key: de::value::StrDeserializer<'_, serde_json::Error> =
                    k.as_str().into_deserializer();
                seed.deserialize(key).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let v = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value was asked for before its key"))?;
        seed.deserialize(Strict(v))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Inner {
        a: Option<u32>,
        #[serde(default)]
        tags: Vec<String>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Outer {
        name: String,
        #[serde(default)]
        inner: Option<Inner>,
        #[serde(default)]
        any: Option<Value>,
    }

    #[test]
    fn objects_deserialize_as_serde_json_does() {
        let v = json!({"name": "x", "inner": {"a": 1, "tags": ["t"]}, "any": [1, {"b": [2]}]});
        let strict: Outer = from_value(&v).unwrap();
        let plain: Outer = serde_json::from_value(v).unwrap();
        assert_eq!(strict, plain);
    }

    #[test]
    fn arrays_are_refused_where_a_struct_is_due_at_any_depth() {
        assert!(
            serde_json::from_value::<Outer>(json!(["x"])).is_ok(),
            "serde's own rule"
        );
        for bad in [
            json!(["x"]),
            json!({"name": "x", "inner": [1, []]}),
            json!({"name": "x", "inner": [null]}),
        ] {
            let err = from_value::<Outer>(&bad).unwrap_err().to_string();
            assert!(err.contains("expected an object"), "{bad}: {err}");
        }
        assert!(from_value::<Outer>(&json!({"name": "x", "bogus": 1})).is_err());
        assert!(from_value::<Outer>(&json!({"name": 5})).is_err());
    }
}
