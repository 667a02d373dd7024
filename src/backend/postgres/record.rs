//! A composite value (`record`) read in PostgreSQL's binary format, so a
//! function returning one row of `OUT` parameters can be called in the
//! select list (`SELECT f(...)`): the server sends one value instead of
//! materialising a set for `SELECT * FROM f(...)`.
//!
//! The format: a 4-byte field count, then per field its type OID (4
//! bytes) and length (4 bytes, -1 for NULL) followed by that many bytes.

use std::error::Error;

use tokio_postgres::types::{FromSql, Kind, Type};

use super::store::Columns;

/// The fields of one composite value, borrowed from the row holding it.
#[derive(Debug)]
pub(super) struct Record<'a> {
    fields: Vec<(Type, Option<&'a [u8]>)>,
}

/// Splits `n` bytes off the front of `rest`.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], Box<dyn Error + Sync + Send>> {
    if rest.len() < n {
        return Err("composite value: truncated".into());
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn take4(rest: &mut &[u8]) -> Result<[u8; 4], Box<dyn Error + Sync + Send>> {
    let mut bytes = [0; 4];
    bytes.copy_from_slice(take(rest, 4)?);
    Ok(bytes)
}

impl<'a> FromSql<'a> for Record<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        let mut rest = raw;
        let count = usize::try_from(i32::from_be_bytes(take4(&mut rest)?))?;
        // Every field takes at least 8 bytes: the count cannot make this
        // allocate more than the value's own size.
        if count > rest.len() / 8 {
            return Err("composite value: more fields than bytes".into());
        }
        let mut fields = Vec::with_capacity(count);
        for _ in 0..count {
            let oid = u32::from_be_bytes(take4(&mut rest)?);
            let ty = Type::from_oid(oid).ok_or("composite value: a field of an unknown type")?;
            let len = i32::from_be_bytes(take4(&mut rest)?);
            let value = match usize::try_from(len) {
                Ok(len) => Some(take(&mut rest, len)?),
                Err(_) if len == -1 => None,
                Err(_) => return Err("composite value: a negative length".into()),
            };
            if let Some(v) = value {
                let fixed = match ty {
                    Type::BOOL => Some(1),
                    Type::INT2 => Some(2),
                    Type::INT4 => Some(4),
                    Type::INT8 => Some(8),
                    _ => None,
                };
                if fixed.is_some_and(|n| n != v.len()) {
                    return Err("composite value: a field of the wrong size".into());
                }
            }
            fields.push((ty, value));
        }
        if !rest.is_empty() {
            return Err("composite value: bytes after the last field".into());
        }
        Ok(Self { fields })
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::RECORD || matches!(ty.kind(), Kind::Composite(_))
    }
}

impl Record<'_> {
    /// The number of fields.
    pub(super) fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether field `i` has type `ty`.
    pub(super) fn is(&self, i: usize, ty: &Type) -> bool {
        self.fields.get(i).is_some_and(|(t, _)| t == ty)
    }
}

impl Columns for Record<'_> {
    fn column<'b, T: FromSql<'b>>(&'b self, i: usize) -> T {
        let (ty, raw) = &self.fields[i];
        match T::from_sql_nullable(ty, *raw) {
            Ok(v) => v,
            Err(e) => panic!("field {i} of a composite value: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(out: &mut Vec<u8>, ty: &Type, value: Option<&[u8]>) {
        out.extend_from_slice(&ty.oid().to_be_bytes());
        match value {
            Some(v) => {
                out.extend_from_slice(&i32::try_from(v.len()).unwrap().to_be_bytes());
                out.extend_from_slice(v);
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }

    fn sample() -> Vec<u8> {
        let mut raw = 3i32.to_be_bytes().to_vec();
        field(&mut raw, &Type::BOOL, Some(&[1]));
        field(&mut raw, &Type::INT8, Some(&42i64.to_be_bytes()));
        field(&mut raw, &Type::BYTEA, None);
        raw
    }

    #[test]
    fn reads_each_field_and_nulls() {
        let raw = sample();
        let r = Record::from_sql(&Type::RECORD, &raw).unwrap();
        assert_eq!(r.len(), 3);
        assert!(r.is(1, &Type::INT8) && !r.is(1, &Type::INT4) && !r.is(3, &Type::INT8));
        assert!(r.column::<bool>(0));
        assert_eq!(r.column::<i64>(1), 42);
        assert_eq!(r.column::<Option<&[u8]>>(2), None);
    }

    #[test]
    fn every_damaged_value_is_an_error_not_a_panic() {
        let raw = sample();
        // Every truncation, and every single-byte change, either decodes
        // or is refused; none panics or allocates from a forged count.
        for end in 0..raw.len() {
            assert!(Record::from_sql(&Type::RECORD, &raw[..end]).is_err());
        }
        for at in 0..raw.len() {
            for byte in [0u8, 0x7f, 0x80, 0xff] {
                let mut bad = raw.clone();
                bad[at] = byte;
                let _ = Record::from_sql(&Type::RECORD, &bad);
            }
        }
        let mut forged = i32::MAX.to_be_bytes().to_vec();
        forged.extend_from_slice(&[0; 16]);
        assert!(Record::from_sql(&Type::RECORD, &forged).is_err());
        let mut wrong_size = 1i32.to_be_bytes().to_vec();
        field(&mut wrong_size, &Type::INT8, Some(&[0; 4]));
        assert!(Record::from_sql(&Type::RECORD, &wrong_size).is_err());
        let mut trailing = sample();
        trailing.push(0);
        assert!(Record::from_sql(&Type::RECORD, &trailing).is_err());
    }
}
